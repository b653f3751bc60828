#!/usr/bin/env bash
# Builds the interop guest: a Debian bookworm kernel plus an initramfs that holds rdma-core,
# perftest, iproute2 and busybox, and an init that brings up rdma_rxe (Soft-RoCE) on the guest's
# virtio NIC, runs one script handed in over a 9p share, and powers off.
#
#   build-guest.sh CACHE_DIR
#
# Produces CACHE_DIR/out/vmlinuz and CACHE_DIR/out/rxe-initrd.cpio.gz. CACHE_DIR/dl keeps the
# downloaded .deb files (about 110 MB) so a rebuild only fetches what changed; CACHE_DIR/stage and
# CACHE_DIR/root are scratch trees (about 400 MB) removed at the end. Usually driven by
# `guest.sh build`, which skips this script entirely when the output is up to date.
#
# Host requirements: Debian bookworm amd64 (libraries are resolved with the host's ldd), apt-get,
# dpkg, cpio, gzip and kmod (depmod, modinfo). Nothing is installed on the host by this script:
# packages are only downloaded and unpacked into CACHE_DIR. If the apt lists are missing or stale
# it runs `apt-get update` once and retries.
set -euo pipefail

cache=$(realpath -m "${1:?usage: build-guest.sh CACHE_DIR}")
dl=$cache/dl stage=$cache/stage root=$cache/root out=$cache/out
mkdir -p "$dl" "$out"
export LC_ALL=C
APT=(apt-get -o APT::Sandbox::User=root -o DPkg::Lock::Timeout=600)

secs() { echo $(( $(date +%s) - t_start )); }
t_start=$(date +%s)

# ---------------------------------------------------------------- which packages
# linux-image-amd64 is a metapackage; follow it to the versioned kernel package. It has to be the
# generic flavour: the "cloud" kernels are built without rdma_rxe.
kernel_pkg() {
  apt-cache depends linux-image-amd64 2>/dev/null \
    | awk '/Depends: linux-image-[0-9]/ { print $2; exit }'
}
USER_PKGS="perftest rdmacm-utils ibverbs-utils ibverbs-providers libibverbs1 librdmacm1 libibumad3
 libpci3 libnl-3-200 libnl-route-3-200 iproute2 libbpf1 libbsd0 libmnl0 libselinux1 libtirpc3
 libxtables12 libcap2 libelf1 libdb5.3 libmd0 libpcre2-8-0 zlib1g libgssapi-krb5-2 libkrb5-3
 libk5crypto3 libcom-err2 libkrb5support0 libkeyutils1 libudev1 busybox-static libc6 libgcc-s1"

# ---------------------------------------------------------------- download (cached)
# `apt-get download --print-uris` names the exact .deb file of each candidate version; only the
# ones not already in $dl are fetched, and stale versions are deleted so the globs below are
# unambiguous.
fetch() {
  local kpkg list missing f
  kpkg=$(kernel_pkg)
  [ -n "$kpkg" ] || return 1
  # shellcheck disable=SC2086
  list=$("${APT[@]}" download --print-uris "$kpkg" $USER_PKGS 2>/dev/null | awk '{ print $2 }') || return 1
  [ "$(echo "$list" | wc -l)" -ge 30 ] || return 1
  missing=()
  for f in $list; do
    [ -s "$dl/$f" ] || missing+=("${f%%_*}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "build-guest: downloading ${#missing[@]} packages" >&2
    (cd "$dl" && "${APT[@]}" download -q "${missing[@]}" >/dev/null) || return 1
  fi
  for f in "$dl"/*.deb; do
    echo "$list" | grep -qxF "$(basename "$f")" || rm -f "$f"
  done
  echo "$kpkg" > "$dl/KERNEL"
}
if ! fetch; then
  echo "build-guest: apt lists missing or stale, running apt-get update" >&2
  "${APT[@]}" update -qq
  fetch || { echo "build-guest: could not download the guest packages" >&2; exit 1; }
fi
KPKG=$(cat "$dl/KERNEL")
echo "build-guest: download done at $(secs)s (kernel package $KPKG)"

# ---------------------------------------------------------------- unpack
rm -rf "$stage" "$root"
mkdir -p "$stage/kernel" "$stage/user" "$root"
dpkg -x "$dl/${KPKG}"_*.deb "$stage/kernel"
for p in $USER_PKGS; do dpkg -x "$dl/${p}"_*.deb "$stage/user"; done
KVER=$(ls "$stage/kernel/lib/modules")
cp "$stage/kernel/boot/vmlinuz-$KVER" "$out/vmlinuz.new"
U=$stage/user

# ---------------------------------------------------------------- filesystem layout
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,tmp,run,root,mnt/share,var/tmp,lib64} \
         "$root"/usr/{bin,sbin,lib/x86_64-linux-gnu}
ln -s usr/lib "$root/lib"        # merged-/usr style: /lib/modules lands in /usr/lib/modules
cp "$U/bin/busybox" "$root/bin/busybox"
for applet in $("$root/bin/busybox" --list); do
  [ -e "$root/bin/$applet" ] || ln -s busybox "$root/bin/$applet"
done
for applet in modprobe insmod rmmod lsmod depmod poweroff reboot; do
  ln -sf ../bin/busybox "$root/sbin/$applet"
done

# ---------------------------------------------------------------- RDMA and network tools
TOOLS="ib_write_bw ib_write_lat ib_send_bw ib_send_lat ib_read_bw ib_read_lat ib_atomic_bw
 ibv_devinfo ibv_devices ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong
 rping ucmatose udaddy rdma_client rdma_server ip rdma"
for t in $TOOLS; do
  src=""
  for d in usr/bin bin usr/sbin sbin; do
    [ -e "$U/$d/$t" ] && { src=$U/$d/$t; break; }
  done
  [ -n "$src" ] || { echo "build-guest: $t not found in the packages" >&2; exit 1; }
  cp "$src" "$root/usr/bin/"
done
rm -f "$root/bin/ip"             # the iproute2 ip, not busybox's applet

# Shared libraries: ask the host's loader to resolve each binary against the unpacked tree.
# The rxe provider is loaded with dlopen(), so it is not in any binary's ldd output; add it and
# its own dependencies by hand (and libgcc_s, which pthread_cancel dlopen()s).
libpath=$U/lib/x86_64-linux-gnu:$U/usr/lib/x86_64-linux-gnu
provider=$(ls "$U"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so)
libs=$(for f in "$root"/usr/bin/* "$provider"; do
         LD_LIBRARY_PATH=$libpath ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
       done; ls "$U"/{usr/,}lib/x86_64-linux-gnu/libgcc_s.so.1 2>/dev/null || true)
for l in $(echo "$libs" | sort -u); do cp -L "$l" "$root/usr/lib/x86_64-linux-gnu/"; done
# The program interpreter: take libc6's real file, not its /lib64 symlink (absolute, so following
# it would pick the host's copy).
ld_so=$( (ls "$U"/{usr/,}lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 2>/dev/null || true) | head -1)
cp -L "$ld_so" "$root/usr/lib/x86_64-linux-gnu/"
ln -s ../usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$root/lib64/ld-linux-x86-64.so.2"
mkdir -p "$root/usr/lib/x86_64-linux-gnu/libibverbs" "$root/etc/libibverbs.d" "$root/etc/iproute2"
cp "$provider" "$root/usr/lib/x86_64-linux-gnu/libibverbs/"
cp "$U/etc/libibverbs.d/rxe.driver" "$root/etc/libibverbs.d/"
cp -r "$U"/etc/iproute2/. "$root/etc/iproute2/" 2>/dev/null || true

echo "root:x:0:0:root:/root:/bin/sh" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
cat > "$root/etc/hosts" <<'EOF'
127.0.0.1 localhost
10.99.0.1 host
10.99.0.2 guest
10.99.0.3 rnic
EOF

# ---------------------------------------------------------------- kernel modules
# Copy the modules we load plus everything they depend on (modinfo's depends field, followed
# recursively). Modules built into this kernel are simply not found, which is fine.
mods=$stage/kernel/lib/modules/$KVER
LOAD="crc32_generic crc32_pclmul virtio_pci virtio_net 9pnet_virtio 9p qemu_fw_cfg ib_uverbs ib_umad rdma_ucm rdma_rxe"
declare -A copied=()
copy_module() {
  local name=$1 file dep
  [ -n "${copied[$name]:-}" ] && return 0
  copied[$name]=1
  file=$(find "$mods" \( -name "$name.ko*" -o -name "${name//_/-}.ko*" \) | head -1)
  [ -n "$file" ] || return 0
  mkdir -p "$root/lib/modules/$KVER/$(dirname "${file#"$mods"/}")"
  cp "$file" "$root/lib/modules/$KVER/${file#"$mods"/}"
  for dep in $(modinfo -F depends "$file" | tr , ' '); do copy_module "$dep"; done
}
for m in $LOAD; do copy_module "$m"; done
for f in modules.order modules.builtin modules.builtin.modinfo; do
  [ -e "$mods/$f" ] && cp "$mods/$f" "$root/lib/modules/$KVER/"
done
depmod -b "$root" -a "$KVER"

# ---------------------------------------------------------------- /init
# Runs as PID 1. The test script arrives as /mnt/share/guest.sh (9p share from the host); its
# combined output goes to /mnt/share/guest.out (and the serial console), its exit code to
# /mnt/share/guest.rc. Markers starting with "[init]" let the host follow the boot.
cat > "$root/init" <<EOF
#!/bin/sh
export PATH=/usr/bin:/bin:/usr/sbin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
up() { cut -d' ' -f1 /proc/uptime; }
echo "[init] kernel up after \$(up)s"
# crc32_pclmul needs the PCLMULQDQ instruction, which qemu's default TCG CPU lacks: its
# failure is expected there (crc32_generic covers it).
for m in $LOAD; do
  modprobe \$m 2>/dev/null || [ \$m = crc32_pclmul ] || echo "[init] modprobe \$m failed"
done
ip link set lo up
NIC=\$(ls /sys/class/net | grep -v '^lo\$' | head -1)
ip link set "\$NIC" up
ip addr add 10.99.0.2/24 dev "\$NIC"
if mount -t 9p -o trans=virtio,version=9p2000.L share /mnt/share 2>/dev/null; then
  echo "[init] host share on /mnt/share"
fi
rdma link add rxe0 type rxe netdev "\$NIC" && echo "[init] rxe0 on \$NIC"
echo "[init] ready after \$(up)s"
if [ -x /mnt/share/guest.sh ]; then
  { /mnt/share/guest.sh 2>&1; echo \$? > /mnt/share/guest.rc; } | tee /mnt/share/guest.out
  echo "[init] guest.sh exit code \$(cat /mnt/share/guest.rc)"
fi
echo "[init] finished after \$(up)s, powering off"
sync
poweroff -f
EOF
chmod +x "$root/init"

(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$out/rxe-initrd.cpio.gz.new"
mv "$out/vmlinuz.new" "$out/vmlinuz"
mv "$out/rxe-initrd.cpio.gz.new" "$out/rxe-initrd.cpio.gz"
echo "$KVER" > "$out/KERNEL_VERSION"
echo "build-guest: kernel $KVER, modules: ${!copied[*]}"
du -sh "$root" "$out/vmlinuz" "$out/rxe-initrd.cpio.gz" | sed 's/^/build-guest: /'
rm -rf "$stage" "$root"
echo "build-guest: total $(secs)s"
