# The OLM bundle image: written by `make bundle` (hack/bundle); edit the
# generator, not this file. Its labels are bundle/metadata/annotations.yaml.
FROM scratch

LABEL com.redhat.openshift.versions=v4.18
LABEL operators.operatorframework.io.bundle.channel.default.v1=candidate
LABEL operators.operatorframework.io.bundle.channels.v1=candidate
LABEL operators.operatorframework.io.bundle.manifests.v1=manifests/
LABEL operators.operatorframework.io.bundle.mediatype.v1=registry+v1
LABEL operators.operatorframework.io.bundle.metadata.v1=metadata/
LABEL operators.operatorframework.io.bundle.package.v1=egress-proxies-operator

COPY bundle/manifests /manifests/
COPY bundle/metadata /metadata/
