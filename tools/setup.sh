#!/usr/bin/env bash
# Installs everything accel needs to build, test and run on Debian bookworm.
# Idempotent: on a machine that already has the packages it only checks them.
#
# Usage (as root):  tools/setup.sh
set -euo pipefail

readonly PACKAGES=(
  bazel-bootstrap
  g++
  libtorch-dev
  libgloo-dev
  libgoogle-glog-dev
  libgflags-dev
  libgtest-dev
  libopenblas0-pthread
  python3-torch
  nlohmann-json3-dev
  # Accelerate's YAML launch configuration.
  libyaml-cpp-dev
  # Cluster engines and their tests (tests/cluster/).
  openmpi-bin
  libopenmpi-dev
  slurm-wlm
  munge
  iproute2
  iptables
  # Experiment tracking: TensorBoard event files and plots.
  libprotobuf-dev
  protobuf-compiler
  python3-protobuf
  python3-matplotlib
  # Python Accelerate's own imports, for the baseline of //tools/bench:startup
  # (../shared/peer): no test needs them.
  python3-packaging
  python3-tqdm
  python3-psutil
  python3-yaml
  # CI's checks: the format check, and the LibTorch 2.6 root
  # (tools/libtorch2_check.sh).
  clang-format
  debootstrap
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: run this script as root (for example: sudo tools/setup.sh)" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
