#!/usr/bin/env bash
# Usage: hack/verify-generated.sh CONTROLLER_GEN
#
# Regenerates the deepcopy code, the CRD and the RBAC role in a scratch copy of
# the tree and fails when any of them differs from the working tree, so a type
# or marker change that was not followed by `make generate manifests` cannot
# reach main (or a test run) unnoticed.
set -euo pipefail

controller_gen=$1
root=$(cd "$(dirname "$0")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

tar -C "$root" --exclude=./bin --exclude=./.git -cf - . | tar -C "$scratch" -xf -
# Remove the outputs first so a generator that would no longer write a file
# shows up as a difference too.
find "$scratch/api" -name 'zz_generated.*.go' -delete
rm -rf "$scratch/config/crd/bases" "$scratch/config/rbac/role.yaml"

make -s -C "$scratch" generate manifests CONTROLLER_GEN="$controller_gen" > /dev/null

status=0
for path in api config/crd/bases config/rbac; do
	if ! diff -ru "$root/$path" "$scratch/$path"; then
		status=1
	fi
done
if [ "$status" -ne 0 ]; then
	echo "generated files are stale: run 'make generate manifests' and commit the result" >&2
	exit 1
fi
