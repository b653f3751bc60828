#!/usr/bin/env bash
# Installs the system packages ferroce needs to build and test, only if something is missing
# (quick when everything is present); `--with-interop` adds what the interop tests' qemu guest
# needs. Uses sudo when not root. Waits for the dpkg lock,
# because a fresh machine may be running its own apt at boot.
set -euo pipefail

APT_PKGS=(libdpdk-dev pkg-config libclang-dev tshark tcpdump python3-pip fonts-dejavu-core
  libibverbs-dev librdmacm-dev perftest ibverbs-utils rdmacm-utils python3-pyverbs infiniband-diags
  util-linux binutils)
PIP_PKGS=(scapy)

missing=()
pkg-config --exists libdpdk 2>/dev/null || missing+=(libdpdk-dev pkg-config)
[ -e /usr/lib/llvm-14/lib/libclang.so ] || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 \
  || missing+=(libclang-dev)
command -v tshark >/dev/null || missing+=(tshark)
command -v tcpdump >/dev/null || missing+=(tcpdump)
# rnic-sim's plots draw their text with this font.
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
# ferroce's libibverbs.so.1 is bound (bindgen) to the installed <infiniband/verbs.h>; the tests
# run Debian's unmodified perftest and rdma-core examples (ibverbs-utils) on it.
[ -e /usr/include/infiniband/verbs.h ] || missing+=(libibverbs-dev)
# ferroce's librdmacm.so.1 is built against librdmacm's headers; rping, ucmatose and udaddy
# (rdmacm-utils) run on it in the tests.
[ -e /usr/include/rdma/rdma_cma.h ] || missing+=(librdmacm-dev)
command -v rping >/dev/null || missing+=(rdmacm-utils)
command -v ib_write_bw >/dev/null || missing+=(perftest)
command -v ibv_rc_pingpong >/dev/null || missing+=(ibverbs-utils)
# Programs beyond those: pyverbs (rdma-core's Python binding, which links the direct-verbs
# libraries the stubs mirror, found with readelf), and ibstat (libibumad, which reads the
# device view ferroce-run makes with unshare and mount).
[ -d /usr/lib/python3/dist-packages/pyverbs ] || missing+=(python3-pyverbs)
command -v ibstat >/dev/null || missing+=(infiniband-diags)
command -v unshare >/dev/null || missing+=(util-linux)
command -v readelf >/dev/null || missing+=(binutils)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${APT_PKGS[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; answer no without a prompt.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null || true
  $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${APT_PKGS[@]}" >/dev/null
fi

for p in "${PIP_PKGS[@]}"; do
  if ! python3 -c "import $p" 2>/dev/null; then
    echo "deps: pip install $p" >&2
    python3 -m pip install -q "$p" 2>/dev/null || python3 -m pip install -q --break-system-packages "$p"
  fi
done

for tool in rustfmt clippy-driver; do
  command -v "$tool" >/dev/null || rustup component add "${tool%-driver}" >/dev/null 2>&1 || true
done

# The interop guest (Linux Soft-RoCE + perftest under qemu): qemu-system-x86, cpio, kmod.
# Only the tests need it (`make test`, `.ci/run`); `make demo` does not.
if [ "${1:-}" = "--with-interop" ]; then
  bash "$(dirname "$0")/../tests/interop/install-deps.sh"
fi

# cargo-fuzz, for the fuzz smoke `make test` runs (scripts/fuzz.sh): built from crates.io once.
if [ "${1:-}" = "--with-interop" ] && ! command -v cargo-fuzz >/dev/null; then
  echo "deps: cargo install cargo-fuzz" >&2
  cargo install --locked --quiet cargo-fuzz
fi
