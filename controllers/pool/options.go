package pool

import (
	"flag"
	"fmt"
	"time"
)

// Options are the pool controller's flags.
type Options struct {
	AutoscaleInterval time.Duration
}

// AddFlags registers the pool controller's flags.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.DurationVar(&o.AutoscaleInterval, "pool-autoscale-interval", DefaultAutoscaleInterval,
		"How often an autoscaled ProxyPool reads its demand from the discovery API and resizes.")
}

// Validate checks the pool controller's flags.
func (o *Options) Validate() error {
	if o.AutoscaleInterval <= 0 {
		return fmt.Errorf("--pool-autoscale-interval must be positive, got %s", o.AutoscaleInterval)
	}
	return nil
}
