package tracing

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"

	"github.com/example/egress-proxies-operator/tracing/tracingtest"
)

// TestOptions: a ratio outside 0..1 and an endpoint that is no http(s)
// URL are refused, naming the flag.
func TestOptions(t *testing.T) {
	require.NoError(t, (&Options{SampleRatio: DefaultSampleRatio}).Validate())
	require.NoError(t, (&Options{Endpoint: "https://collector:4318", SampleRatio: 1}).Validate())
	assert.ErrorContains(t, (&Options{SampleRatio: 1.5}).Validate(), "--trace-sample-ratio")
	assert.ErrorContains(t, (&Options{Endpoint: "collector:4318"}).Validate(), "--otlp-endpoint")
}

// TestTracesURL: a base endpoint takes the traces path; a full one is kept.
func TestTracesURL(t *testing.T) {
	assert.Equal(t, "http://collector:4318/v1/traces", tracesURL("http://collector:4318"))
	assert.Equal(t, "http://collector:4318/v1/traces", tracesURL("http://collector:4318/"))
	assert.Equal(t, "https://otlp.example/custom/traces", tracesURL("https://otlp.example/custom/traces"))
}

// TestSetupAndStop: spans go to the endpoint until stop, which sends what
// is left and puts back the provider in force before; no endpoint sends
// nothing.
func TestSetupAndStop(t *testing.T) {
	receiver := tracingtest.Start()
	defer receiver.Close()
	before := otel.GetTracerProvider()
	stop, err := Setup(context.Background(), Options{Endpoint: receiver.URL, SampleRatio: 1}, "unit")
	require.NoError(t, err)
	_, span := Tracer("test").Start(context.Background(), "work")
	span.SetAttributes(KeyTenant.String("team-a"))
	span.End()
	require.NoError(t, stop(context.Background()))
	assert.Equal(t, before, otel.GetTracerProvider())
	spans := receiver.Named("work")
	require.Len(t, spans, 1)
	assert.Equal(t, "team-a", spans[0].Attributes["egress.tenant"])
	assert.Equal(t, "unit", spans[0].Service)

	stop, err = Setup(context.Background(), Options{SampleRatio: 1}, "unit")
	require.NoError(t, err)
	_, span = Tracer("test").Start(context.Background(), "unsent")
	span.End()
	require.NoError(t, stop(context.Background()))
	assert.Empty(t, receiver.Named("unsent"))
}
