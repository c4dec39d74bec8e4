package tracing

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of the operator's spans.
const (
	// KeyTenant is the crawler team a span's work is for.
	KeyTenant = attribute.Key("egress.tenant")
	// KeySession is a gateway session's name, as the client gave it.
	KeySession = attribute.Key("egress.session")
	// KeyProxy is the proxy (namespace/name) that carried or was leased.
	KeyProxy = attribute.Key("egress.proxy")
	// KeyHost is the site's host.
	KeyHost = attribute.Key("egress.host")
	// KeyExitIP is where the site saw the request come from.
	KeyExitIP = attribute.Key("egress.exit_ip")
	// KeyPaceWait is how long the request waited for its host's pace.
	KeyPaceWait = attribute.Key("egress.pace_wait_seconds")
	// KeyBytesUp and KeyBytesDown are what a tunnel or request carried.
	KeyBytesUp   = attribute.Key("egress.bytes_up")
	KeyBytesDown = attribute.Key("egress.bytes_down")
	// KeyOutcome is how it ended (a tunnel's close reason, a request's
	// outcome, a reconcile's action).
	KeyOutcome = attribute.Key("egress.outcome")
)

// Tracer is the operator's tracer of one component (its import path),
// from the provider in force now.
func Tracer(component string) trace.Tracer { return otel.Tracer(component) }

// FromRequest is r's context in the trace r's traceparent names (its own
// context when it names none): a server's spans for r then join the
// client's trace.
func FromRequest(r *http.Request) context.Context {
	return otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
}

// Options are the tracing flags.
type Options struct {
	// Endpoint is the OTLP/HTTP endpoint's URL (http://collector:4318);
	// empty: no traces.
	Endpoint string
	// SampleRatio is the share of traces started here that are sampled;
	// a trace a client started keeps its own decision (parent-based).
	SampleRatio float64
}

// DefaultSampleRatio samples one trace in ten started here: a gateway
// carries thousands of tunnels a second.
const DefaultSampleRatio = 0.1

// AddFlags registers the tracing flags.
func (o *Options) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Endpoint, "otlp-endpoint", "",
		"OTLP/HTTP endpoint (http://collector:4318, or https://; /v1/traces is added to one without a path) the operator sends its traces to: a span per gateway tunnel or request, per lease and per Proxy reconcile. Empty: no traces.")
	fs.Float64Var(&o.SampleRatio, "trace-sample-ratio", DefaultSampleRatio,
		"Share of the traces started by the operator that are sampled (0 to 1); a request whose traceparent says sampled is always traced.")
}

// Validate checks the tracing flags.
func (o *Options) Validate() error {
	var errs []error
	if o.SampleRatio < 0 || o.SampleRatio > 1 {
		errs = append(errs, fmt.Errorf("--trace-sample-ratio must be from 0 to 1, got %g", o.SampleRatio))
	}
	if o.Endpoint != "" {
		u, err := url.Parse(o.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("--otlp-endpoint must be an http:// or https:// URL, got %q", o.Endpoint))
		}
	}
	return errors.Join(errs...)
}

// tracesURL is where spans are sent for endpoint: as OTLP's base endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT), an endpoint without a path takes
// /v1/traces; one with a path is the traces URL as it is.
func tracesURL(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Path != "" && u.Path != "/") {
		return endpoint
	}
	u.Path = "/v1/traces"
	return u.String()
}

// Setup makes the operator's spans go to o.Endpoint (nothing without
// one), and W3C traceparent and baggage the way traces are carried in and
// out. Call the returned function to send what is left and stop; it puts
// back the provider that was in force before.
func Setup(ctx context.Context, o Options, service string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	if o.Endpoint == "" {
		return func(context.Context) error { return nil }, nil
	}
	exporter, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(tracesURL(o.Endpoint)))
	if err != nil {
		return nil, fmt.Errorf("the OTLP exporter for %s: %w", o.Endpoint, err)
	}
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))),
	)
	previous := otel.GetTracerProvider()
	otel.SetTracerProvider(provider)
	return func(ctx context.Context) error {
		otel.SetTracerProvider(previous)
		return provider.Shutdown(ctx)
	}, nil
}
