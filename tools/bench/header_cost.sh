#!/usr/bin/env bash
# What including accel costs a user's compile, over LibTorch's own header:
# compiles, REPEAT times each, a file that includes only <torch/torch.h>,
# one that also includes accel/accelerator.h (each with a main that uses
# it, as a training program would), and one that includes only
# accel/accelerator.h (what of LibTorch it pulls in itself), the way
# Bazel's default fastbuild compiles (g++ -std=c++17 -c, no optimisation),
# and prints seconds min/median/max and the header's cost over
# <torch/torch.h> (difference of the medians).
#
#   tools/bench/header_cost.sh                 # this checkout, 5 times
#   tools/bench/header_cost.sh /path/to/other/checkout 3
#
# Run by hand on a quiet machine (it is not a test).
set -euo pipefail
checkout=$(cd "${1:-$(dirname "$0")/../..}" && pwd)
repeat=${2:-5}
if ! [[ "$repeat" =~ ^[1-9][0-9]*$ ]]; then
  echo "header_cost: REPEAT must be a whole number from 1, found '$repeat'" >&2
  exit 2
fi
[[ -f "$checkout/accel/accelerator.h" ]] || {
  echo "header_cost: $checkout is not an accel checkout (no accel/accelerator.h)" >&2
  exit 2
}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

cat >"$scratch/torch_only.cc" <<'EOF'
#include <torch/torch.h>
int main() {
  torch::nn::Linear model(4, 2);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  auto loss = model(torch::ones({8, 4})).sum();
  loss.backward();
  optimizer.step();
}
EOF
cat >"$scratch/with_accel.cc" <<'EOF'
#include <torch/torch.h>
#include "accel/accelerator.h"
int main() {
  accel::Accelerator accelerator;
  torch::nn::Linear model(4, 2);
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  accelerator.prepare(model, optimizer);
  auto loss = model(torch::ones({8, 4})).sum();
  accelerator.backward(loss);
  optimizer.step();
  accelerator.wait_for_everyone();
}
EOF

cat >"$scratch/accel_only.cc" <<'EOF'
#include "accel/accelerator.h"
int main() {
  accel::Accelerator accelerator;
  accelerator.wait_for_everyone();
}
EOF

flags=(-std=c++17 -c -w -I "$checkout"
       -I /usr/include/torch/csrc/api/include
       -DUSE_DISTRIBUTED -DUSE_C10D_GLOO -DUSE_RPC -DUSE_TENSORPIPE)

# Prints the sorted times of REPEAT compiles of $1, in seconds.
times_of() {
  local i start end
  for ((i = 0; i < repeat; ++i)); do
    start=$(date +%s.%N)
    g++ "${flags[@]}" "$scratch/$1.cc" -o "$scratch/$1.o" || {
      echo "header_cost: compiling $1.cc failed (above)" >&2
      return 1
    }
    end=$(date +%s.%N)
    awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
  done | sort -n
}

# min median max of sorted numbers on stdin.
summary() {
  awk '{v[NR] = $1} END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%8.2f %8.2f %8.2f\n", v[1], m, v[NR]
  }'
}

echo "checkout: $checkout ($(git -C "$checkout" log -1 --format=%h 2>/dev/null || echo '?'))"
echo "g++ $(g++ -dumpfullversion), $repeat compiles each, seconds"
printf '%-34s %8s %8s %8s\n' "file" "min" "median" "max"
for name in torch_only with_accel accel_only; do
  times_of "$name" >"$scratch/$name.times" || exit 1
done
torch_only=$(summary <"$scratch/torch_only.times")
with_accel=$(summary <"$scratch/with_accel.times")
accel_only=$(summary <"$scratch/accel_only.times")
printf '%-34s %s\n' "<torch/torch.h> alone" "$torch_only"
printf '%-34s %s\n' "+ accel/accelerator.h" "$with_accel"
printf '%-34s %s\n' "accel/accelerator.h alone" "$accel_only"
awk -v a="$torch_only" -v b="$with_accel" 'BEGIN {
  split(a, x, " "); split(b, y, " ")
  printf "%-34s %8s %8.2f\n", "accel/accelerator.h costs", "", y[2] - x[2]
}'
