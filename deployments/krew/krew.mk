# make krew, included by the top Makefile: the kubectl-gpufrac release archives
# the krew manifest (deployments/krew/gpufrac.yaml) points at, one per platform,
# reproducible (static, -trimpath, fixed tar metadata), with their sha256s.
#
#   make krew                       # bin/krew/kubectl-gpufrac_v$(VERSION)_<os>_<arch>.tar.gz + sha256s
#   kubectl krew install --manifest=deployments/krew/gpufrac.yaml \
#     --archive=bin/krew/kubectl-gpufrac_v$(VERSION)_linux_amd64.tar.gz   # try it before a release
#
# At a release, upload the archives and put the printed sha256s in the manifest.

KREW_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
KREW_DIR ?= $(BIN)/krew

.PHONY: krew
## krew: kubectl-gpufrac archives for the krew manifest, with their sha256s
krew:
	@set -e; mkdir -p $(KREW_DIR); for p in $(KREW_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; dir=$(KREW_DIR)/$${os}_$${arch}; mkdir -p $$dir; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build $(GO_BUILDFLAGS) -ldflags '$(GO_LDFLAGS)' -o $$dir/kubectl-gpufrac ./cmd/kubectl-gpufrac; \
		cp LICENSE $$dir/LICENSE; \
		archive=$(KREW_DIR)/kubectl-gpufrac_v$(VERSION)_$${os}_$${arch}.tar.gz; \
		tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C $$dir -cf - kubectl-gpufrac LICENSE | gzip -n > $$archive; \
		echo "$$(sha256sum $$archive | cut -d' ' -f1)  $$(basename $$archive)"; \
	done
