# ferroce: the two commands of the README, and helpers.
#   make demo   - install what is missing, build, run the main job on the embedded default
#   make test   - install what is missing, run every test (unit, integration, interop)
#   make install PREFIX=/usr/local - rnicd, rnic-perf, rnic-ctl, rnic-pcap, and the C client
#                 (libferroce_client.so, ferroce.h, ferroce.pc)
CARGO ?= cargo
PREFIX ?= /usr/local
# install-files copies from target/$(PROFILE) (release, or debug for a dev build).
PROFILE ?= release
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

.PHONY: deps test-deps demo test lint bench fmt install install-files

deps:
	@bash scripts/deps.sh

test-deps:
	@bash scripts/deps.sh --with-interop

demo: deps
	@bash scripts/demo.sh

test: test-deps
	# The C client's shared library, which the tests link the C example against.
	$(CARGO) build -p ferroce-client
	$(CARGO) test --workspace --no-fail-fast

install:
	$(CARGO) build --release -p ferroce-tools -p ferroce-client
	$(MAKE) install-files PROFILE=release

install-files:
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	for b in rnicd rnic-perf rnic-ctl rnic-pcap; do \
		if [ -e target/$(PROFILE)/$$b ]; then install -m 0755 target/$(PROFILE)/$$b $(DESTDIR)$(PREFIX)/bin/; fi; \
	done
	install -m 0755 target/$(PROFILE)/libferroce_client.so $(DESTDIR)$(PREFIX)/lib/
	install -m 0644 dataplane/client/include/ferroce.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' dataplane/client/ferroce.pc.in \
		> $(DESTDIR)$(PREFIX)/lib/pkgconfig/ferroce.pc

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

bench: deps
	$(CARGO) bench --workspace

fmt:
	$(CARGO) fmt --all
