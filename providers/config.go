package providers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Config is the parsed --providers-config file: the named provider instances
// Proxies may refer to by spec.provider.
type Config struct {
	// Providers lists the instances, each with a unique name.
	Providers []InstanceConfig `json:"providers"`
}

// InstanceConfig is one named provider instance, such as gcp-eu of type gcp.
// Settings stay raw here: each provider type decodes (and strictly checks) its
// own, so this package never learns a concrete provider's fields.
type InstanceConfig struct {
	// Name is what spec.provider refers to; a DNS label.
	Name string `json:"name"`
	// Type selects the provider implementation, for example kubernetes or gcp.
	Type string `json:"type"`
	// Settings are the type-specific settings, decoded by that type.
	Settings map[string]any `json:"settings,omitempty"`
	// Pricing is what the instance's proxies cost, for the usage API's
	// cost figure (none: its usage has no cost).
	Pricing *Pricing `json:"pricing,omitempty"`
}

// Pricing is a provider instance's prices, in the currency of your bill.
type Pricing struct {
	// ProxyHour is one proxy for an hour: its VM or pod, with its public
	// IPv4 address (AWS bills that apart: add it here).
	ProxyHour float64 `json:"proxyHour"`
	// GiB is one GiB carried through a proxy, either way (the cloud's
	// egress price).
	GiB float64 `json:"gib"`
}

// LoadConfig reads and parses a providers config file. Every error names the
// file and, where it can, the instance and field at fault, because the
// operator refuses to start on a bad file and the message is all a user sees.
func LoadConfig(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("reading providers config %q: %w", path, err)
	}
	cfg, err := ParseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("providers config %q: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig parses a providers config document, rejecting unknown fields,
// unnamed or duplicate instances and instances without a type. Instances are
// decoded one by one so an error can say which instance it is about.
func ParseConfig(data []byte) (Config, error) {
	var doc struct {
		Providers []json.RawMessage `json:"providers"`
	}
	if err := yaml.UnmarshalStrict(data, &doc); err != nil {
		return Config{}, fmt.Errorf("parsing: %w", err)
	}
	cfg := Config{Providers: make([]InstanceConfig, 0, len(doc.Providers))}
	var errs []error
	seen := make(map[string]bool, len(doc.Providers))
	for i, raw := range doc.Providers {
		inst, err := decodeInstance(raw)
		where := fmt.Sprintf("providers[%d]", i)
		if inst.Name != "" {
			where = fmt.Sprintf("providers[%d] %q", i, inst.Name)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		switch {
		case inst.Name == "":
			errs = append(errs, fmt.Errorf("%s: name is required", where))
		case len(validation.IsDNS1123Label(inst.Name)) > 0:
			errs = append(errs, fmt.Errorf("%s: name must be a DNS label (lowercase letters, digits and '-', at most 63 characters)", where))
		case seen[inst.Name]:
			errs = append(errs, fmt.Errorf("%s: duplicate name", where))
		}
		seen[inst.Name] = true
		if inst.Type == "" {
			errs = append(errs, fmt.Errorf("%s: type is required", where))
		}
		if p := inst.Pricing; p != nil && (p.ProxyHour < 0 || p.GiB < 0) {
			errs = append(errs, fmt.Errorf("%s: pricing.proxyHour and pricing.gib must not be negative", where))
		}
		cfg.Providers = append(cfg.Providers, inst)
	}
	if err := errors.Join(errs...); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// decodeInstance decodes one instance strictly. On error it still returns
// the name when it could be read, for the message.
func decodeInstance(raw json.RawMessage) (InstanceConfig, error) {
	var inst InstanceConfig
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&inst); err != nil {
		var named struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(raw, &named)
		return InstanceConfig{Name: named.Name}, err
	}
	return inst, nil
}

// Names lists the configured instance names in file order, for messages that
// tell a user which names exist.
func (c Config) Names() []string {
	names := make([]string, 0, len(c.Providers))
	for _, p := range c.Providers {
		names = append(names, p.Name)
	}
	return names
}
