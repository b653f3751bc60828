#!/usr/bin/env bash
# Host packages for the Soft-RoCE interop guest: qemu-system-x86 (the emulator), cpio and kmod
# (to pack the guest's initramfs and index its modules) and tcpdump (to look at tap0).
#
# Returns at once when every tool is already on PATH, so scripts/deps.sh can call it every time.
#
# Why the extra apt source: this machine kind ships qemu-utils 10.x from bookworm-backports.
# Installing bookworm's own qemu-system-x86 (7.2) would make apt drop that qemu-utils, so qemu is
# taken from bookworm-backports instead. We do not touch the machine's apt configuration: a
# throw-away sources list and list/archive cache are built under a temp dir, pointing at the same
# Debian mirror the machine already uses, and removed afterwards.
#
# Root is needed (sudo is used when not root). Waits up to 10 min for the dpkg lock, because a
# freshly booted machine may still be running its own apt.
set -u

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

want=""
for pair in qemu-system-x86_64:qemu-system-x86 cpio:cpio depmod:kmod modinfo:kmod tcpdump:tcpdump; do
  tool=${pair%%:*} pkg=${pair##*:}
  if ! command -v "$tool" >/dev/null 2>&1 && ! [ -x "/usr/sbin/$tool" ] && ! [ -x "/sbin/$tool" ]; then
    case " $want " in *" $pkg "*) ;; *) want="$want $pkg" ;; esac
  fi
done
[ -z "$want" ] && exit 0
echo "interop deps: installing$want" >&2

# The Debian mirror this machine already trusts: first URIs: line of a deb822 .sources file, or
# the first deb line of the classic sources.list.
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null)
if [ -z "$mirror" ]; then
  mirror=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' \
    /etc/apt/sources.list 2>/dev/null)
fi
[ -n "$mirror" ] || { echo "interop deps: no Debian mirror found in the apt configuration" >&2; exit 1; }

tmp=$(mktemp -d /tmp/ferroce-apt.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/archives/partial"
key=/usr/share/keyrings/debian-archive-keyring.gpg
for suite in bookworm bookworm-updates bookworm-backports; do
  echo "deb [signed-by=$key] $mirror $suite main"
done > "$tmp/sources.list"

opts=(-o "Dir::Etc::sourcelist=$tmp/sources.list" -o "Dir::Etc::sourceparts=-"
      -o "Dir::State::lists=$tmp/lists" -o "Dir::Cache::archives=$tmp/archives"
      -o APT::Sandbox::User=root -o DPkg::Lock::Timeout=600)
# shellcheck disable=SC2086  # $want is a word list on purpose
$SUDO apt-get "${opts[@]}" update -qq \
  && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y -qq \
       --no-install-recommends --no-remove -t bookworm-backports $want >/dev/null
