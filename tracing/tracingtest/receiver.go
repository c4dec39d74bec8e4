// Package tracingtest is an in-process OTLP/HTTP receiver for tests: it
// takes the spans an exporter sends and lets a test find them by name.
//
// It must never be imported by production code.
package tracingtest

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is one received span, flattened.
type Span struct {
	Name, TraceID, SpanID, ParentID string
	// Attributes are its attributes, each as a string.
	Attributes map[string]string
	// Service is its resource's service.name.
	Service string
}

// Receiver takes OTLP/HTTP trace exports (protobuf) at URL + "/v1/traces".
type Receiver struct {
	URL string
	srv *httptest.Server

	mu    sync.Mutex
	spans []Span
}

// Start starts a receiver; Close stops it.
func Start() *Receiver {
	r := &Receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.URL = r.srv.URL
	return r
}

// Close stops the receiver.
func (r *Receiver) Close() { r.srv.Close() }

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil || req.URL.Path != "/v1/traces" {
		http.Error(w, "not a trace export", http.StatusBadRequest)
		return
	}
	var export coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &export); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range export.GetResourceSpans() {
		service := attributes(rs.GetResource().GetAttributes())["service.name"]
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, Span{Name: s.GetName(), TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentID: hex.EncodeToString(s.GetParentSpanId()), Attributes: attributes(s.GetAttributes()), Service: service})
			}
		}
	}
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func attributes(kvs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			out[kv.GetKey()] = strconv.FormatInt(v.IntValue, 10)
		case *commonpb.AnyValue_DoubleValue:
			out[kv.GetKey()] = strconv.FormatFloat(v.DoubleValue, 'g', -1, 64)
		case *commonpb.AnyValue_BoolValue:
			out[kv.GetKey()] = strconv.FormatBool(v.BoolValue)
		default:
			out[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return out
}

// Spans is every span received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Named is the spans received so far of that name.
func (r *Receiver) Named(name string) []Span {
	var out []Span
	for _, s := range r.Spans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}
