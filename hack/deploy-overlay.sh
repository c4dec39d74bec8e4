#!/usr/bin/env bash
# Usage: hack/deploy-overlay.sh IMAGE
#
# Writes bin/deploy/kustomization.yaml: config/default with the manager image
# set to IMAGE. `make deploy` applies it, so deploying never edits a tracked
# file (kubebuilder's `kustomize edit set image` does).
set -euo pipefail

image=$1
root=$(cd "$(dirname "$0")/.." && pwd)
# Split IMAGE into name and tag; a ':' followed by a '/' belongs to a
# registry port, not a tag.
name=$image tag=
if [[ $image =~ ^(.+):([^:/]+)$ ]]; then
	name=${BASH_REMATCH[1]} tag=${BASH_REMATCH[2]}
fi
mkdir -p "$root/bin/deploy"
{
	echo "apiVersion: kustomize.config.k8s.io/v1beta1"
	echo "kind: Kustomization"
	echo "resources:"
	echo "- ../../config/default"
	echo "images:"
	echo "- name: controller"
	echo "  newName: $name"
	if [ -n "$tag" ]; then echo "  newTag: \"$tag\""; fi
} > "$root/bin/deploy/kustomization.yaml"
echo "$root/bin/deploy"
