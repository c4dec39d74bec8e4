package broker

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Selectors: what a lease or tunnel asks of a proxy's attributes.

// Selector is a set of attribute equalities, all of which must hold.
type Selector map[string]string

// key is a canonical form of the selector, for the candidate cache and the
// store's index of its candidates. It is never empty: an empty Candidates
// key asks a store for no index, and the empty selector (every proxy) is
// the one that most needs one.
func (s Selector) key() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteString("selector:")
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(s[k])
		b.WriteByte(0)
	}
	return b.String()
}

// Matches says whether attrs satisfy every pair of the selector.
func (s Selector) Matches(attrs map[string]string) bool {
	for k, want := range s {
		if attrs[k] != want {
			return false
		}
	}
	return true
}

// selectorKey is the CRD's rule for attribute keys.
var selectorKey = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// ValidateSelector names the first bad key or value.
func ValidateSelector(field string, s Selector) error {
	if len(s) > 32 {
		return fmt.Errorf("%s has %d keys; at most 32", field, len(s))
	}
	for k, val := range s {
		if len(k) > 63 || !selectorKey.MatchString(k) {
			return fmt.Errorf("%s key %q must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", field, k)
		}
		if len(val) > 253 {
			return fmt.Errorf("%s value for %q is longer than 253 characters", field, k)
		}
	}
	return nil
}
