#!/usr/bin/env bash
# Usage: hack/verify-generated.sh CONTROLLER_GEN
#
# Regenerates the deepcopy code, the apply configurations, the CRD, the RBAC role, the chart's copies of
# them and the OLM bundle in a scratch copy of the tree and fails when any of
# them differs from the working tree, so a type, marker or manifest change
# that was not followed by `make generate manifests bundle` cannot reach main
# (or a test run) unnoticed.
set -euo pipefail

controller_gen=$1
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

tar -C "$root" --exclude=./bin --exclude=./.git -cf - . | tar -C "$scratch" -xf -
# Remove the outputs first so a generator that would no longer write a file
# shows up as a difference too.
find "$scratch/api" -name 'zz_generated.*.go' -delete
rm -rf "$scratch/api/v1alpha1/applyconfiguration"
rm -rf "$scratch/config/crd/bases" "$scratch/config/rbac/role.yaml" \
	"$scratch/charts/egress-proxies-operator/files" "$scratch/bundle" "$scratch/bundle.Dockerfile"

make -s -C "$scratch" generate manifests bundle CONTROLLER_GEN="$controller_gen" > /dev/null

status=0
for path in api config/crd/bases config/rbac charts/egress-proxies-operator/files bundle bundle.Dockerfile; do
	if ! diff -ru "$root/$path" "$scratch/$path"; then
		status=1
	fi
done
if [ "$status" -ne 0 ]; then
	echo "generated files are stale: run 'make generate manifests bundle' and commit the result" >&2
	exit 1
fi
