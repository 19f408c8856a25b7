#!/usr/bin/env bash
# Builds and tests accel against LibTorch 2.6, the version Debian trixie
# ships, without touching this machine's own packages: a trixie root made
# with debootstrap (cached between runs), the checkout bound into it, and
# `bazel test //...` run there (see ../shared/toolchain.md for the recipe's
# measurements). .ci/run runs it after the bookworm (LibTorch 1.13) tests.
#
# Usage (as root):
#   tools/libtorch2_check.sh                    # bazel test //...
#   tools/libtorch2_check.sh build //accel      # any bazel command
#   tools/libtorch2_check.sh --root-only        # make the root, nothing else
#   ACCEL_TRIXIE_ROOT=/other/dir tools/libtorch2_check.sh
#
# The root (about 2.5 GB) lives in $ACCEL_TRIXIE_ROOT, default
# /var/cache/accel/trixie-root; it is made again when the package list below
# changes. Bazel's output base and disk cache stay inside it, so a second run
# rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
readonly CHECKOUT="$PWD"
readonly ROOT="${ACCEL_TRIXIE_ROOT:-/var/cache/accel/trixie-root}"
readonly PACKAGES=(
  bazel-bootstrap g++ git libtorch-dev libgloo-dev libgoogle-glog-dev
  libgflags-dev libgtest-dev libgmock-dev nlohmann-json3-dev libyaml-cpp-dev libprotobuf-dev
  protobuf-compiler libopenblas0-pthread libopenmpi-dev openmpi-bin
  python3 python3-torch python3-protobuf python3-matplotlib python3-numpy
  procps iproute2 ca-certificates
)
readonly STAMP="$ROOT/.accel-packages-$(echo "${PACKAGES[*]}" | md5sum | cut -c1-12)"

log() { echo "libtorch2_check: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
  log "run as root (debootstrap, chroot and bind mounts need it)"
  exit 1
fi

# The mirror this machine's apt uses (trixie is on the same one).
mirror() {
  local uri
  uri=$(grep -hoE '^URIs: *[^ ]+' /etc/apt/sources.list.d/*.sources 2>/dev/null |
    head -1 | sed 's/^URIs: *//')
  if [ -z "$uri" ]; then
    uri=$(grep -hoE '^deb +[^ ]+' /etc/apt/sources.list 2>/dev/null |
      head -1 | awk '{print $2}')
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

make_root() {
  log "making the trixie root in $ROOT (about 6 minutes, once)"
  command -v debootstrap >/dev/null || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2
  }
  rm -rf "$ROOT"
  mkdir -p "$(dirname "$ROOT")"
  debootstrap --variant=minbase trixie "$ROOT" "$(mirror)" >&2
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  mount_all
  chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
    apt-get update -q >&2
  chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >&2
  touch "$STAMP"
}

MOUNTED=()
mount_all() {
  local target
  for target in proc sys dev dev/shm; do
    mkdir -p "$ROOT/$target"
    if ! mountpoint -q "$ROOT/$target"; then
      case "$target" in
        proc) mount -t proc proc "$ROOT/proc" ;;
        sys) mount -t sysfs sysfs "$ROOT/sys" ;;
        *) mount --bind "/$target" "$ROOT/$target" ;;
      esac
      MOUNTED=("$ROOT/$target" "${MOUNTED[@]}")
    fi
  done
  mkdir -p "$ROOT/accel"
  if ! mountpoint -q "$ROOT/accel"; then
    mount --bind "$CHECKOUT" "$ROOT/accel"
    MOUNTED=("$ROOT/accel" "${MOUNTED[@]}")
  fi
  # The CUDA toolkit with NCCL, read-only: the nccl backend compiles against
  # LibTorch 2.6 as against 1.13.
  local cuda
  cuda=$(readlink -f /usr/local/cuda 2>/dev/null || true)
  if [ -n "$cuda" ] && [ -d "$cuda" ]; then
    mkdir -p "$ROOT$cuda"
    ln -sfn "$cuda" "$ROOT/usr/local/cuda"
    if ! mountpoint -q "$ROOT$cuda"; then
      mount --bind -o ro "$cuda" "$ROOT$cuda"
      MOUNTED=("$ROOT$cuda" "${MOUNTED[@]}")
    fi
    # Its libraries, found as on this machine (ld.so.conf.d).
    local conf
    for conf in /etc/ld.so.conf.d/*cuda*; do
      [ -f "$conf" ] && cp "$conf" "$ROOT/etc/ld.so.conf.d/"
    done
    chroot "$ROOT" ldconfig
  fi
}

unmount_all() {
  local target
  for target in "${MOUNTED[@]}"; do umount -l "$target" 2>/dev/null || true; done
}
trap unmount_all EXIT

# A root made for an older package list only needs the new packages.
add_packages() {
  log "adding packages to the trixie root in $ROOT"
  mount_all
  chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
    apt-get update -q >&2
  chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >&2
  rm -f "$ROOT"/.accel-packages-*
  touch "$STAMP"
}

if [ ! -f "$STAMP" ]; then
  if compgen -G "$ROOT/.accel-packages-*" >/dev/null &&
     [ -x "$ROOT/usr/bin/apt-get" ]; then
    add_packages
  else
    make_root
  fi
fi
# .ci/run makes the root in the background while the CPU builds: it waits
# on the network and the disk more than on the processor.
if [ "${1:-}" = "--root-only" ]; then
  log "the trixie root in $ROOT is ready"
  exit 0
fi
mount_all

command=("$@")
[ ${#command[@]} -gt 0 ] || command=(test //...)
version=$(chroot "$ROOT" dpkg-query -W -f='${Version}' libtorch-dev)
log "bazel ${command[*]} against LibTorch $version"
# No convenience symlinks: bazel-bin and the rest in the checkout stay the
# host's. HOME and a PATH of the root's own.
chroot "$ROOT" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 /bin/bash -c \
  'cd /accel && git config --global --add safe.directory /accel 2>/dev/null;
   bazel "$@" --symlink_prefix=/' bazel "${command[@]}"
