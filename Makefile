# egress-proxies-operator: every target works on a machine with Go and
# Debian's packages only. Tools are built from source into bin/, keyed by
# version, so a second run is instant and nothing prebuilt is downloaded.

# bash for pipefail: a failed benchmark must fail `make bench` through tee.
SHELL := /bin/bash

IMG ?= egress-proxies-operator:dev
NAMESPACE ?= egress-proxies-operator-system

# The release the chart and the OLM bundle describe. Keep VERSION equal to
# the chart's appVersion (a test checks).
VERSION ?= 0.1.0
IMAGE_REPO ?= ghcr.io/example/egress-proxies-operator
CHANNELS ?= candidate
DEFAULT_CHANNEL ?= candidate
CHART := charts/egress-proxies-operator
# config/rbac's roles, read by the chart from its files/ (Helm cannot read
# outside the chart).
CHART_RBAC := role.yaml leader_election_role.yaml metrics_reader_role.yaml proxy_editor_role.yaml proxy_viewer_role.yaml proxy_leaser_role.yaml attribution_reader_role.yaml

# Go tools, pinned.
CONTROLLER_TOOLS_VERSION ?= v0.21.0
GOLANGCI_LINT_VERSION ?= v2.15.0

# The control plane for envtest: versions come from the tools module that
# builds it, so there is one place to bump them.
CONTROLPLANE_MOD := hack/controlplane/go.mod
K8S_VERSION := $(shell awk '$$1 == "k8s.io/kubernetes" && $$2 ~ /^v/ {print $$2; exit}' $(CONTROLPLANE_MOD))
ETCD_VERSION := $(shell awk '$$1 == "go.etcd.io/etcd/server/v3" && $$2 ~ /^v/ {print $$2; exit}' $(CONTROLPLANE_MOD))
ifeq ($(filter v%,$(K8S_VERSION)),)
$(error could not read the k8s.io/kubernetes version from $(CONTROLPLANE_MOD))
endif
ifeq ($(filter v%,$(ETCD_VERSION)),)
$(error could not read the go.etcd.io/etcd/server/v3 version from $(CONTROLPLANE_MOD))
endif
K8S_MINOR := $(word 2,$(subst ., ,$(K8S_VERSION)))
GOOS := $(shell go env GOOS)
GOARCH := $(shell go env GOARCH)

BIN := $(CURDIR)/bin
CONTROLLER_GEN := $(BIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
ENVTEST_ASSETS := $(BIN)/k8s/$(K8S_VERSION)-etcd-$(ETCD_VERSION)-$(GOOS)-$(GOARCH)
KUBECTL := $(ENVTEST_ASSETS)/kubectl

# kube-apiserver and kubectl report the release they were built from, as the
# official builds do, instead of v0.0.0-master.
VERSION_LDFLAGS := $(foreach pkg,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
	-X $(pkg).gitVersion=$(K8S_VERSION) -X $(pkg).gitMajor=1 -X $(pkg).gitMinor=$(K8S_MINOR) -X $(pkg).gitTreeState=clean)

GO_TEST_FLAGS ?= -race -count=1

.DEFAULT_GOAL := help

##@ General

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate the API types' deepcopy code and apply configurations (server-side apply).
	$(CONTROLLER_GEN) object applyconfiguration paths=./api/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD (config/crd/bases) and RBAC (config/rbac) from markers, and copy them into the chart.
	$(CONTROLLER_GEN) crd rbac:roleName=manager-role paths=./... \
		output:crd:artifacts:config=config/crd/bases output:rbac:artifacts:config=config/rbac
	mkdir -p $(CHART)/files/crds $(CHART)/files/rbac
	cp config/crd/bases/crawl.example.com_proxies.yaml config/crd/bases/crawl.example.com_proxypools.yaml config/crd/bases/crawl.example.com_crawltargets.yaml config/crd/bases/crawl.example.com_tenantquotas.yaml $(CHART)/files/crds/
	cp $(addprefix config/rbac/,$(CHART_RBAC)) $(CHART)/files/rbac/

.PHONY: bundle
bundle: manifests ## Write the OLM bundle (bundle/, bundle.Dockerfile) from the kustomize base.
	go run ./hack/bundle -version $(VERSION) -image $(IMAGE_REPO):v$(VERSION) \
		-channels $(CHANNELS) -default-channel $(DEFAULT_CHANNEL)

.PHONY: verify-generated
verify-generated: $(CONTROLLER_GEN) ## Fail when committed generated files (code, CRD, RBAC, chart copies, bundle) differ from a fresh generation.
	@hack/verify-generated.sh "$(CONTROLLER_GEN)"

.PHONY: fmt
fmt: ## Run gofmt on the tree.
	gofmt -l -w $$(git ls-files '*.go')

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run go vet and golangci-lint (the soak test's build tag included).
	go vet -tags soak ./...
	$(GOLANGCI_LINT) run ./...

.PHONY: test
test: verify-generated envtest ## Run unit and envtest suites with -race (builds the control plane first).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test $(GO_TEST_FLAGS) ./...

# -p 1: one package's benchmarks at a time, so none measures another's load.
BENCH_FLAGS ?= -run '^$$' -bench . -benchtime 1x -count 1 -p 1 -timeout 45m
BENCH_RESULTS ?= bench/results

.PHONY: bench
bench: envtest squid ## Run every benchmark; print the table of figures beside their baselines and write it under bench/results.
	set -o pipefail; KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test $(BENCH_FLAGS) ./... | tee $(BIN)/bench-output.txt
	go run ./hack/benchtable -out $(BENCH_RESULTS) < $(BIN)/bench-output.txt
	if grep -q '^BenchmarkFleet/' $(BIN)/bench-output.txt; then \
		go run ./hack/benchplot -in "$$(ls -t $(BENCH_RESULTS)/*.md | head -1)" -out docs/images/fleet-curves.svg; fi

SOAK_DURATION ?= 6m
SOAK_FLAGS ?=

.PHONY: soak
soak: envtest squid ## Run the operator for SOAK_DURATION under faults and load, then check nothing was lost (needs root, as make test does).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go test -tags soak -count=1 -timeout 60m -v -run '^TestSoak$$' ./test/soak/ \
		-args -soak.duration=$(SOAK_DURATION) $(SOAK_FLAGS)

.PHONY: soak-ha
soak-ha: ## The soak with two operator replicas sharing a real Redis, the second killed again and again (needs redis-server).
	$(MAKE) soak SOAK_FLAGS='-soak.replicas=2 $(SOAK_FLAGS)'

FUZZ_TIME ?= 30s

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZ_TIME (their seed corpora run in make test).
	go test -run '^$$' -fuzz '^FuzzDecodeLeaseRequest$$' -fuzztime $(FUZZ_TIME) ./discovery/
	go test -run '^$$' -fuzz '^FuzzParseListQuery$$' -fuzztime $(FUZZ_TIME) ./discovery/

.PHONY: demo
demo: envtest squid ## Run the operator locally with real Squid proxies and a pool; Ctrl-C ends it (status 0).
	KUBEBUILDER_ASSETS="$(ENVTEST_ASSETS)" go run ./hack/demo

.PHONY: squid
squid: ## Install Debian's squid if it is missing (needs root), or say how.
	@if command -v squid >/dev/null 2>&1 || [ -x /usr/sbin/squid ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq squid; \
	else \
		echo "squid is missing: run  sudo apt-get install -y squid" >&2; exit 1; \
	fi

##@ Build

# The operator's build tags (test/cluster.BuildTags, the Dockerfile's):
# grpcnotrace leaves out gRPC's request tracing, whose templates would keep
# every exported method of the binary (decision 106).
GO_TAGS ?= grpcnotrace

.PHONY: build
build: ## Build the operator binary into bin/.
	CGO_ENABLED=0 go build -tags $(GO_TAGS) -o $(BIN)/egress-proxies-operator .

.PHONY: run-dev
run-dev: ## Run the operator against the current kubeconfig context.
	go run -tags $(GO_TAGS) . --metrics-bind-address=0 --health-probe-bind-address=:8081 \
		--providers-config=config/manager/providers_config.yaml $(ARGS)

.PHONY: docker-build
docker-build: ## Build the container image (needs a Docker engine).
	docker build -t $(IMG) .

.PHONY: bundle-build
bundle-build: ## Build the OLM bundle image (needs a Docker engine).
	docker build -f bundle.Dockerfile -t $(IMAGE_REPO)-bundle:v$(VERSION) .

##@ Deployment

.PHONY: install
install: manifests $(KUBECTL) ## Install the CRD into the current kubeconfig's cluster.
	$(KUBECTL) apply --server-side -k config/crd

.PHONY: uninstall
uninstall: $(KUBECTL) ## Remove the CRD (and with it every Proxy).
	$(KUBECTL) delete --ignore-not-found -k config/crd

.PHONY: deploy
deploy: manifests $(KUBECTL) ## Deploy the operator with image IMG to the current cluster.
	@hack/deploy-overlay.sh "$(IMG)" > /dev/null
	$(KUBECTL) apply --server-side -k $(BIN)/deploy

.PHONY: undeploy
undeploy: $(KUBECTL) ## Remove the operator from the current cluster.
	@hack/deploy-overlay.sh "$(IMG)" > /dev/null
	$(KUBECTL) delete --ignore-not-found -k $(BIN)/deploy

##@ Tools

.PHONY: envtest
envtest: $(ENVTEST_ASSETS)/kube-apiserver $(ENVTEST_ASSETS)/etcd $(KUBECTL) ## Build kube-apiserver, etcd and kubectl from source into bin/k8s.
	@echo "KUBEBUILDER_ASSETS=$(ENVTEST_ASSETS)"

$(ENVTEST_ASSETS)/kube-apiserver: | $(ENVTEST_ASSETS)
	cd hack/controlplane && CGO_ENABLED=0 go build -ldflags "-s -w $(VERSION_LDFLAGS)" -o $@.tmp k8s.io/kubernetes/cmd/kube-apiserver
	mv $@.tmp $@

$(KUBECTL): | $(ENVTEST_ASSETS)
	cd hack/controlplane && CGO_ENABLED=0 go build -ldflags "-s -w $(VERSION_LDFLAGS)" -o $@.tmp k8s.io/kubernetes/cmd/kubectl
	mv $@.tmp $@

$(ENVTEST_ASSETS)/etcd: | $(ENVTEST_ASSETS)
	cd hack/controlplane && CGO_ENABLED=0 go build -ldflags "-s -w" -o $@.tmp go.etcd.io/etcd/server/v3
	mv $@.tmp $@

$(ENVTEST_ASSETS):
	mkdir -p $@

$(CONTROLLER_GEN):
	GOBIN=$(BIN)/tmp-controller-gen go install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(BIN)/tmp-controller-gen/controller-gen $@ && rmdir $(BIN)/tmp-controller-gen

$(GOLANGCI_LINT):
	GOBIN=$(BIN)/tmp-golangci-lint go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/tmp-golangci-lint/golangci-lint $@ && rmdir $(BIN)/tmp-golangci-lint
