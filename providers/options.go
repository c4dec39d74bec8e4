package providers

import (
	"flag"
	"fmt"
)

// Options are the providers' flag: the file naming the provider instances.
type Options struct {
	// ConfigPath is --providers-config; empty: no providers, so only
	// External proxies work.
	ConfigPath string
}

// AddFlags registers the providers' flag.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.ConfigPath, "providers-config", "",
		"Path of the YAML file naming the provider instances (for example gcp-eu). Empty: no providers, so only External proxies work.")
}

// Load reads the file and checks every instance's settings with the types
// registry knows, before anything connects, so an offline start with a bad
// file reports the file. Its errors name the flag.
func (o *Options) Load(registry Registry) (Config, error) {
	if o.ConfigPath == "" {
		return Config{}, nil
	}
	cfg, err := LoadConfig(o.ConfigPath)
	if err != nil {
		return Config{}, fmt.Errorf("--providers-config: %w", err)
	}
	if err := registry.Check(cfg); err != nil {
		return Config{}, fmt.Errorf("--providers-config %s: %w", o.ConfigPath, err)
	}
	return cfg, nil
}
