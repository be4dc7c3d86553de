# make images, included by the top Makefile: the two component images, built
# from the repository root with whatever OCI builder the machine has.
#
#   make images                          # ghcr.io/gpufrac/gpufrac-{node,coordinator}:$(VERSION)
#   make images IMAGE_REGISTRY=reg.example.com/gpu OCI_BUILDER=podman
#
# The tag is VERSION, the chart's appVersion (never latest), so `helm install`
# of the same checkout pulls exactly these images.

IMAGE_REGISTRY ?= ghcr.io/gpufrac
IMAGES := gpufrac-node gpufrac-coordinator
# The first of docker, podman and buildah found on PATH.
OCI_BUILDER ?= $(firstword $(foreach b,docker podman buildah,$(if $(shell command -v $(b) 2>/dev/null),$(b))))

.PHONY: images
## images: gpufrac-node and gpufrac-coordinator images tagged $(VERSION) (docker, podman or buildah)
images:
	@if [ -z "$(OCI_BUILDER)" ]; then \
		echo "make images: no OCI image builder found: looked for docker, podman and buildah on PATH." >&2; \
		echo "Install one of them, or name another with OCI_BUILDER=<command> (it must accept 'build -f FILE --build-arg K=V -t TAG DIR')." >&2; \
		exit 1; \
	fi
	@set -e; for i in $(IMAGES); do \
		echo "==> $(IMAGE_REGISTRY)/$$i:$(VERSION) with $(OCI_BUILDER)"; \
		$(OCI_BUILDER) build -f deployments/images/$$i/Dockerfile --build-arg VERSION=$(VERSION) \
			-t $(IMAGE_REGISTRY)/$$i:$(VERSION) $(CURDIR); \
	done
