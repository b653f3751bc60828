#!/usr/bin/env bash
# ferroce interop harness: a Linux Soft-RoCE (rdma_rxe) peer in a qemu guest whose NIC is tap0 in a
# private network namespace. See tests/interop/README.md.
#
#   guest.sh deps                       install host packages (qemu, cpio, kmod, tcpdump)
#   guest.sh build [--force]            build the guest into the cache dir (no-op when up to date)
#   guest.sh up                         create the namespace and tap0 (idempotent)
#   guest.sh down                       delete the namespace
#   guest.sh run GUEST_SCRIPT [TIMEOUT_S]
#                                       boot the guest, run GUEST_SCRIPT in it, power off; prints the
#                                       path of the script's output (CACHE/share/guest.out)
#   guest.sh selfcheck                  check the harness without ferroce: rxe loopback in the
#                                       guest, then ARP/ICMP/RoCE frames through tap0 to a raw
#                                       AF_PACKET socket (afpacket_probe.py) standing in for ferroce
#   guest.sh status                     show cache, namespace and tap state
#
# Environment:
#   FERROCE_INTEROP_DIR    cache dir (default /var/tmp/ferroce-interop)
#   FERROCE_INTEROP_NS     namespace name (default rnic-interop)
#   FERROCE_INTEROP_ACCEL  qemu accelerator: tcg (default) or kvm. This machine kind has a
#                          /dev/kvm, but its vCPU lacks basic CPUID features and the guest hangs
#                          after "Booting from ROM"; kvm is only for machines where it works.
#   FERROCE_INTEROP_SMP    guest vCPUs (default 1; the machine has 2 cores)
#   FERROCE_INTEROP_MEM    guest memory in MiB (default 1024)
#   FERROCE_INTEROP_QUIET  1: do not copy the guest console to stderr during `run`
#   FERROCE_INTEROP_OFFLOADS  0 (default): tap0 behaves like a 1500-byte wire, every frame
#                          complete (checksums filled in, no GSO); 1: qemu's vnet_hdr offloads,
#                          so guest<->host-kernel TCP shows up on tap0 as up to 64 KiB frames
#                          with partial checksums (RoCE frames are unaffected either way)
#
# Addresses (everything stays inside the namespace, nothing is routed out of it):
#   10.99.0.1/24  host kernel side of tap0 (perftest's TCP exchange, port 18515)
#   10.99.0.2/24  guest eth0, MAC 52:54:00:99:00:02, rxe0 GID index 1 = ::ffff:10.99.0.2
#   10.99.0.3     free for ferroce, MAC 02:00:00:99:00:03 (attach to tap0 from inside the namespace)
# Must run as root.
set -euo pipefail

HERE=$(dirname "$(realpath "$0")")
CACHE=$(realpath -m "${FERROCE_INTEROP_DIR:-/var/tmp/ferroce-interop}")
NS=${FERROCE_INTEROP_NS:-rnic-interop}
TAP=tap0
HOST_IP=10.99.0.1/24
GUEST_MAC=52:54:00:99:00:02

die() { echo "guest.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (namespaces, tap, qemu)"

# The build is up to date when the outputs exist and were made by the current build script.
stamp_want() { sha256sum "$HERE/build-guest.sh" | cut -d' ' -f1; }
is_built() {
  [ -s "$CACHE/out/vmlinuz" ] && [ -s "$CACHE/out/rxe-initrd.cpio.gz" ] \
    && [ "$(cat "$CACHE/out/STAMP" 2>/dev/null)" = "$(stamp_want)" ]
}

cmd_deps() { "$HERE/install-deps.sh"; }

cmd_build() {
  local force=0
  [ "${1:-}" = --force ] && force=1
  if [ $force = 0 ] && is_built; then
    echo "guest.sh: guest up to date in $CACHE/out (kernel $(cat "$CACHE/out/KERNEL_VERSION" 2>/dev/null))" >&2
    return 0
  fi
  cmd_deps
  mkdir -p "$CACHE"
  # one builder at a time per cache dir
  (
    flock -w 1800 9 || die "timed out waiting for another build in $CACHE"
    if [ $force = 0 ] && is_built; then exit 0; fi
    rm -f "$CACHE/out/STAMP"
    "$HERE/build-guest.sh" "$CACHE"
    stamp_want > "$CACHE/out/STAMP"
  ) 9>"$CACHE/build.lock"
}

cmd_up() {
  [ -e "/run/netns/$NS" ] || ip netns add "$NS"
  ip -n "$NS" link set lo up
  ip -n "$NS" link show "$TAP" >/dev/null 2>&1 || ip -n "$NS" tuntap add dev "$TAP" mode tap
  ip -n "$NS" link set "$TAP" up
  ip -n "$NS" addr replace "$HOST_IP" dev "$TAP"
}

cmd_down() {
  [ -e "/run/netns/$NS" ] || return 0
  local pids
  pids=$(ip netns pids "$NS" 2>/dev/null | tr '\n' ' ')
  # Processes inside keep the namespace (and tap0) alive after it is unnamed; we do not kill
  # them here because they belong to whoever started them.
  [ -z "$pids" ] || echo "guest.sh: note: processes still in $NS: $pids" >&2
  ip netns del "$NS"
}

accel_args() {
  case "${FERROCE_INTEROP_ACCEL:-tcg}" in
    tcg) echo "-accel tcg" ;;
    kvm) echo "-accel kvm -cpu host" ;;
    *) die "FERROCE_INTEROP_ACCEL must be tcg or kvm" ;;
  esac
}

cmd_run() {
  local script=${1:-} timeout_s=${2:-300}
  [ -n "$script" ] && [ -f "$script" ] || die "usage: guest.sh run GUEST_SCRIPT [TIMEOUT_S]"
  script=$(realpath "$script")
  is_built || cmd_build
  command -v qemu-system-x86_64 >/dev/null || cmd_deps
  cmd_up
  local share=$CACHE/share console=$CACHE/console.log
  mkdir -p "$share"
  exec 8>"$CACHE/run.lock"
  flock -w "$timeout_s" 8 || die "another guest is running from $CACHE"
  rm -f "$share/guest.sh" "$share/guest.out" "$share/guest.rc"
  cp "$script" "$share/guest.sh"
  chmod +x "$share/guest.sh"
  local tee_to=/dev/stderr
  [ "${FERROCE_INTEROP_QUIET:-0}" = 1 ] && tee_to=/dev/null
  local rc=0 vnet_hdr=off
  [ "${FERROCE_INTEROP_OFFLOADS:-0}" = 1 ] && vnet_hdr=on
  # shellcheck disable=SC2046  # accel_args is a word list on purpose
  ip netns exec "$NS" timeout -k 5 "$timeout_s" qemu-system-x86_64 $(accel_args) \
    -m "${FERROCE_INTEROP_MEM:-1024}" -smp "${FERROCE_INTEROP_SMP:-1}" \
    -kernel "$CACHE/out/vmlinuz" -initrd "$CACHE/out/rxe-initrd.cpio.gz" \
    -append "console=ttyS0 quiet loglevel=4 panic=-1" \
    -netdev "tap,id=n0,ifname=$TAP,script=no,downscript=no,vnet_hdr=$vnet_hdr" \
    -device "virtio-net-pci,netdev=n0,mac=$GUEST_MAC,romfile=" \
    -virtfs "local,path=$share,mount_tag=share,security_model=none,id=share" \
    -nographic -no-reboot -nodefaults -serial stdio </dev/null 2>&1 \
    | tee "$console" >"$tee_to" || rc=$?   # pipefail: qemu's (or timeout's) status
  exec 8>&-
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "guest.sh: guest timed out after ${timeout_s}s (console: $console)" >&2
    return 124
  fi
  [ -f "$share/guest.rc" ] || { echo "guest.sh: guest did not finish its script (qemu rc $rc, console: $console)" >&2; return 1; }
  echo "$share/guest.out"
}

cmd_selfcheck() {
  local out probe_log probe_pid="" failed=0
  out=$(cmd_run "$HERE/guest/selftest.sh" 180) || die "selftest guest did not run"
  if [ "$(cat "$CACHE/share/guest.rc")" = 0 ] && grep -q "selftest ib_write_bw rc=0" "$out"; then
    echo "selfcheck: rxe loopback in the guest: ok"
  else
    echo "selfcheck: rxe loopback in the guest: FAILED (see $out)"; failed=1
  fi
  cmd_up
  probe_log=$(mktemp /tmp/ferroce-interop-probe.XXXXXX)
  ip netns exec "$NS" python3 "$HERE/afpacket_probe.py" --seconds 170 --quiet >"$probe_log" 2>&1 &
  probe_pid=$!
  trap 'kill "$probe_pid" 2>/dev/null; rm -f "$probe_log"' EXIT
  sleep 1
  out=$(cmd_run "$HERE/guest/probe-rnic.sh" 150) || failed=1
  kill "$probe_pid" 2>/dev/null; wait "$probe_pid" 2>/dev/null || true
  local summary
  summary=$(tail -1 "$probe_log")
  if grep -q "probe ping rc=0" "$CACHE/share/guest.out" 2>/dev/null \
     && echo "$summary" | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(not (s["echo_replies_sent"] >= 3 and s["roce_frames"] >= 1 and s["max_frame_len"] <= 1514))'; then
    echo "selfcheck: AF_PACKET on tap0 (ARP, ICMP echo both ways, RoCEv2 frame seen): ok"
  else
    echo "selfcheck: AF_PACKET on tap0: FAILED (guest: $CACHE/share/guest.out, probe: $summary)"; failed=1
  fi
  rm -f "$probe_log"; trap - EXIT
  return $failed
}

cmd_status() {
  echo "cache:     $CACHE ($(is_built && echo "built, kernel $(cat "$CACHE/out/KERNEL_VERSION")" || echo "not built"))"
  if [ -e "/run/netns/$NS" ]; then
    echo "namespace: $NS"
    ip -n "$NS" -br addr show "$TAP" 2>/dev/null | sed 's/^/  /'
    echo "  pids: $(ip netns pids "$NS" | tr '\n' ' ')"
  else
    echo "namespace: $NS (absent)"
  fi
}

sub=${1:-}
shift || true
case "$sub" in
  deps) cmd_deps ;;
  build) cmd_build "$@" ;;
  up) cmd_up ;;
  down) cmd_down ;;
  run) cmd_run "$@" ;;
  selfcheck) cmd_selfcheck ;;
  status) cmd_status ;;
  *) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
