# Build the operator as a static binary, then ship it alone on distroless.
FROM golang:1.26 AS builder
ARG TARGETOS=linux
ARG TARGETARCH=amd64
WORKDIR /workspace
# Dependencies first, so source edits reuse the module layer.
COPY go.mod go.sum ./
RUN go mod download
COPY main.go setup.go ./
COPY operator/ operator/
COPY api/ api/
COPY controllers/ controllers/
COPY providers/ providers/
COPY health/ health/
COPY bans/ bans/
COPY lease/ lease/
COPY broker/ broker/
COPY feed/ feed/
COPY discovery/ discovery/
COPY credentials/ credentials/
COPY gateway/ gateway/
COPY kubeauth/ kubeauth/
COPY tenant/ tenant/
COPY intern/ intern/
COPY client/ client/
COPY tlsprint/ tlsprint/
COPY inspect/ inspect/
COPY shard/ shard/
COPY netid/ netid/
COPY geoip/ geoip/
COPY tracing/ tracing/
RUN CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -trimpath -tags grpcnotrace -ldflags "-s -w" -o manager .

FROM gcr.io/distroless/static:nonroot
WORKDIR /
COPY --from=builder /workspace/manager .
# Numeric, so runAsNonRoot can verify it without a passwd lookup.
USER 65532:65532
ENTRYPOINT ["/manager"]
