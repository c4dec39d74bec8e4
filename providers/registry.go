package providers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Dependencies are what a provider may need from the operator to run.
type Dependencies struct {
	// Client reads through the manager's cache and writes to the API server;
	// the kubernetes provider keeps its pods with it. Nil when the registry
	// only checks the config (Check), before the operator connects.
	Client client.Client
}

// Factory builds one named provider instance from its settings. It must
// reject unknown settings and name any missing required one, and it must
// not connect anywhere: Check calls it before the operator has a cluster.
type Factory func(name string, settings map[string]any, deps Dependencies) (Provider, error)

// Registry maps a provider type (the `type` of a providers config entry) to
// its Factory. main holds the one static Registry, so this package never
// imports a concrete provider.
type Registry map[string]Factory

// Build builds every instance in cfg. Every problem is reported, each naming
// the instance, so one fix-and-restart cycle is enough.
func (r Registry) Build(cfg Config, deps Dependencies) (Set, error) {
	set := make(Set, len(cfg.Providers))
	var errs []error
	for i, inst := range cfg.Providers {
		factory, ok := r[inst.Type]
		if !ok {
			errs = append(errs, fmt.Errorf("providers[%d] %q: unknown type %q (known: %v)", i, inst.Name, inst.Type, slices.Sorted(maps.Keys(r))))
			continue
		}
		p, err := factory(inst.Name, inst.Settings, deps)
		if err != nil {
			errs = append(errs, fmt.Errorf("providers[%d] %q (type %s): %w", i, inst.Name, inst.Type, err))
			continue
		}
		set[inst.Name] = p
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return set, nil
}

// Check builds every instance in cfg with no dependencies and discards them:
// every factory checks its settings without connecting anywhere, so a bad
// providers config is reported before the operator contacts the API server.
func (r Registry) Check(cfg Config) error {
	set, err := r.Build(cfg, Dependencies{})
	for _, p := range set {
		if closer, ok := p.(io.Closer); ok {
			_ = closer.Close()
		}
	}
	return err
}

// Set is the configured provider instances by name.
type Set map[string]Provider

// Names lists the instance names, sorted, for messages telling a user which
// names exist.
func (s Set) Names() []string { return slices.Sorted(maps.Keys(s)) }

// DecodeSettings decodes a providers config entry's settings into a
// provider's settings struct, rejecting unknown fields.
func DecodeSettings(settings map[string]any, into any) error {
	raw, err := json.Marshal(settings)
	if err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	return nil
}
