# ferroce: the two commands of the README, and helpers.
#   make demo   - install what is missing, build, run the main job on the embedded default
#   make test   - install what is missing, run every test (unit, integration, interop)
#   make demo-incast - 8:1 incast of ferroce RNICs through the switch model, with and
#                 without DCQCN (simulated time), then the same on DPDK through the
#                 emulated switch (real time, slowed 10x), with plots
#   make install PREFIX=/usr/local - rnicd, rnic-perf, rnic-ctl, rnic-pcap, rnic-sim (with
#                 man pages, bash/zsh/fish completions, a systemd unit for rnicd), the C client
#                 (libferroce_client.so, ferroce.h, ferroce.pc), ferroce-run and the drop-in
#                 libibverbs.so.1 (with stub libmlx5.so.1, libefa.so.1, librdmacm.so.1) in
#                 lib/ferroce
#   make fuzz T=TARGET S=SECONDS - fuzz one target (scripts/fuzz.sh; `scripts/fuzz.sh list`)
#   make ibverbs  - the drop-in libibverbs in target/$(PROFILE)/ferroce, for scripts/ferroce-run
CARGO ?= cargo
PREFIX ?= /usr/local
# install-files copies from target/$(PROFILE) (release, or debug for a dev build).
PROFILE ?= release
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

CC ?= cc
# The directory ferroce-run puts first on the library path (libibverbs.so.1 and the stubs).
IBV_DIR = target/$(PROFILE)/ferroce
# Where the system's provider libraries are, whose direct-verbs exports the stubs mirror.
DV_LIBDIR ?= /usr/lib/$(shell $(CC) -print-multiarch)

.PHONY: fuzz deps test-deps demo demo-incast test lint bench fmt install install-files ibverbs ibverbs-dir

deps:
	@bash scripts/deps.sh

test-deps:
	@bash scripts/deps.sh --with-interop

demo: deps
	@bash scripts/demo.sh

# 8:1 incast of ferroce RNICs (the transport engine) through the switch model, on simulated
# time: PFC only, DCQCN paper and firmware side by side; then the same RNICs on DPDK through
# the emulated switch, in real time, slowed down 10x (docs/dcb.md).
demo-incast: deps
	$(CARGO) build --release -p ferroce-tools
	target/release/rnic-sim rnics --senders 8 --rate 25 --png target/incast.png --csv target/incast.csv
	target/release/rnic-sim rnics --senders 8 --rate 25 --dpdk 10 --png target/incast-dpdk.png --csv target/incast-dpdk.csv
	@echo "plots: target/incast.png, target/incast-dpdk.png; samples: target/incast.csv, target/incast-dpdk.csv"

test: test-deps
	# The C client's shared library, which the tests link the C example against.
	$(CARGO) build -p ferroce-client -p ferroce-ibverbs
	$(CARGO) test --workspace --no-fail-fast
	# libFuzzer over every fuzz target, a short run each (docs/reliability.md).
	bash scripts/fuzz.sh smoke

fuzz:
	bash scripts/fuzz.sh run $(T) $(or $(S),60)

install:
	$(CARGO) build --release -p ferroce-tools -p ferroce-client -p ferroce-ibverbs
	$(MAKE) install-files PROFILE=release

ibverbs:
	$(CARGO) build $(if $(filter release,$(PROFILE)),--release) -p ferroce-ibverbs
	$(MAKE) ibverbs-dir PROFILE=$(PROFILE)

# libibverbs.so.1 (a link to the cdylib cargo built) and stubs of the direct-verbs provider
# libraries (libmlx5.so.1, libefa.so.1) that Debian's perftest and pyverbs link: generated
# from the installed libraries, every function with the real symbol versions, each answering
# "not this device" (scripts/gen-dv-stubs.py).
ibverbs-dir:
	install -d $(IBV_DIR)/stubs
	ln -sf ../libibverbs.so $(IBV_DIR)/libibverbs.so.1
	for l in mlx5 efa; do \
		python3 scripts/gen-dv-stubs.py $(DV_LIBDIR)/lib$$l.so.1 infiniband/$${l}dv.h \
			$(IBV_DIR)/stubs/$$l.c $(IBV_DIR)/stubs/$$l.map && \
		$(CC) -shared -fPIC -O2 -Wall \
			-o $(IBV_DIR)/lib$$l.so.1 $(IBV_DIR)/stubs/$$l.c \
			-Wl,--version-script=$(IBV_DIR)/stubs/$$l.map -Wl,-soname,lib$$l.so.1 \
			|| exit 1; \
	done
	# librdmacm.so.1: the rdma_cm calls ferroce serves (dataplane/ibverbs/rdmacm.c, forwarding
	# to this libibverbs.so.1) and, for every other symbol of the installed librdmacm, a stub
	# that fails (ENOSYS) and says why once.
	python3 scripts/gen-dv-stubs.py --errno ENOSYS --int-error minus-one \
		--note "this rdma_cm call is not served by ferroce yet (multicast and rsockets are not)" \
		--implemented dataplane/ibverbs/rdmacm.c \
		$(DV_LIBDIR)/librdmacm.so.1 rdma/rdma_cma.h,rdma/rdma_verbs.h,rdma/rsocket.h \
		$(IBV_DIR)/stubs/rdmacm.c $(IBV_DIR)/stubs/rdmacm.map
	$(CC) -shared -fPIC -O2 -Wall -o $(IBV_DIR)/librdmacm.so.1 $(IBV_DIR)/stubs/rdmacm.c \
		dataplane/ibverbs/rdmacm.c -L$(IBV_DIR) -l:libibverbs.so.1 \
		-Wl,--version-script=$(IBV_DIR)/stubs/rdmacm.map -Wl,-soname,librdmacm.so.1

TOOLS = rnicd rnic-perf rnic-ctl rnic-pcap rnic-sim

install-files:
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include \
		$(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/bash-completion/completions \
		$(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d \
		$(DESTDIR)$(PREFIX)/lib/systemd/system
	# Each tool, its man page and its completions (generated from its own argument parser).
	for b in $(TOOLS); do \
		if [ -e target/$(PROFILE)/$$b ]; then \
			install -m 0755 target/$(PROFILE)/$$b $(DESTDIR)$(PREFIX)/bin/ && \
			target/$(PROFILE)/$$b --generate-man > $(DESTDIR)$(PREFIX)/share/man/man1/$$b.1 && \
			target/$(PROFILE)/$$b --generate-completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/$$b && \
			target/$(PROFILE)/$$b --generate-completions zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_$$b && \
			target/$(PROFILE)/$$b --generate-completions fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/$$b.fish \
			|| exit 1; \
		fi; \
	done
	sed -e 's|@PREFIX@|$(PREFIX)|g' tools/dist/rnicd.service.in > $(DESTDIR)$(PREFIX)/lib/systemd/system/rnicd.service
	install -m 0755 target/$(PROFILE)/libferroce_client.so $(DESTDIR)$(PREFIX)/lib/
	install -m 0644 dataplane/client/include/ferroce.h $(DESTDIR)$(PREFIX)/include/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' dataplane/client/ferroce.pc.in \
		> $(DESTDIR)$(PREFIX)/lib/pkgconfig/ferroce.pc
	install -m 0755 scripts/ferroce-run $(DESTDIR)$(PREFIX)/bin/
	if [ -e target/$(PROFILE)/libibverbs.so ]; then \
		$(MAKE) -s ibverbs-dir PROFILE=$(PROFILE) && \
		install -d $(DESTDIR)$(PREFIX)/lib/ferroce && \
		for l in libibverbs.so.1 libmlx5.so.1 libefa.so.1 librdmacm.so.1; do \
			install -m 0755 $(IBV_DIR)/$$l $(DESTDIR)$(PREFIX)/lib/ferroce/; \
		done; \
	fi

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

bench: deps
	$(CARGO) bench --workspace

fmt:
	$(CARGO) fmt --all
