#!/usr/bin/env bash
# The installed tools run outside Bazel, from a bare PATH and environment.
set -euo pipefail
prefix="$TEST_TMPDIR/prefix"
tools/install "$prefix"
for tool in accel-launch accel-env accel-config accel-merge-weights \
    accel-estimate-memory accel-test accel-plot-metrics; do
  test -x "$prefix/bin/$tool" || { echo "FAIL: $tool not installed"; exit 1; }
done

report=$(env -i HOME="$TEST_TMPDIR" PATH=/usr/bin:/bin RANK=0 WORLD_SIZE=1 \
           ACCEL_RUN_SECRET=hunter2 "$prefix/bin/accel-env")
echo "$report"
expect() {
  grep -qF -- "$1" <<<"$report" || { echo "FAIL: no '$1' in the report"; exit 1; }
}
expect "Copy-and-paste the text below in your GitHub issue"
expect "- accel version: 0.1.1"
# The LibTorch this system has (1.13 on bookworm, 2.6 on trixie).
libtorch=$(dpkg-query -W -f='${Version}' libtorch-dev | cut -d. -f1,2)
expect "- LibTorch version: $libtorch"
expect "- Gloo version: 0.5.0"
expect "- MPI version: "
expect "- CUDA: "
expect "- NCCL version: "
expect "- Backends linked: gloo, mpi, nccl (--backend=auto picks gloo)"
expect "- Trackers linked: jsonl, tensorboard"
expect "- GPUs visible: "
expect "- CPUs: "
expect "- Threads: LibTorch intra-op "
expect "- BLAS: "
expect "    RANK=0"
expect "    WORLD_SIZE=1"
expect "    ACCEL_RUN_SECRET=(set, not shown)"
expect "- Launch config: none ($TEST_TMPDIR/.config/accel/default_config.yaml does not exist; accel-config writes it)"
if grep -q hunter2 <<<"$report"; then echo "FAIL: the secret is shown"; exit 1; fi

if "$prefix/bin/accel-env" --bogus 2>"$TEST_TMPDIR/err"; then
  echo "FAIL: accel-env accepted an argument"; exit 1
fi
grep -q "accel env takes no arguments, found '--bogus'" "$TEST_TMPDIR/err"

help=$("$prefix/bin/accel-launch" --help 2>&1 || true)
grep -q "num_processes" <<<"$help" || { echo "FAIL: accel-launch --help"; exit 1; }
if "$prefix/bin/accel-merge-weights" 2>"$TEST_TMPDIR/err"; then
  echo "FAIL: accel-merge-weights ran without arguments"; exit 1
fi
grep -q "usage: accel-merge-weights CHECKPOINT OUT" "$TEST_TMPDIR/err" ||
  { echo "FAIL: accel-merge-weights usage"; cat "$TEST_TMPDIR/err"; exit 1; }
"$prefix/bin/accel-plot-metrics" --help | grep -q "metrics.jsonl" ||
  { echo "FAIL: accel-plot-metrics --help"; exit 1; }

# accel-estimate-memory prints docs/parallelism.md's table: DDP's 16 bytes per
# parameter are 14.9 GiB for 1B, stage 3's 2 at 8 processes 1.9 GiB.
table=$(env -i HOME="$TEST_TMPDIR" PATH=/usr/bin:/bin \
          "$prefix/bin/accel-estimate-memory" --parameters=1B)
grep -qF "1,000,000,000 parameters (--parameters=1B)" <<<"$table" &&
  grep -qE "^0 \(DDP\) +16\.00 +14\.9 GiB" <<<"$table" &&
  grep -qE "^3 \(ZeRO 3\)\*.* 2\.00 +1\.9 GiB$" <<<"$table" ||
  { echo "FAIL: accel-estimate-memory --parameters=1B printed:"; echo "$table"; exit 1; }
if "$prefix/bin/accel-estimate-memory" --parameters=lots 2>"$TEST_TMPDIR/err"; then
  echo "FAIL: accel-estimate-memory accepted --parameters=lots"; exit 1
fi
grep -q "error: --parameters: expected a whole number" "$TEST_TMPDIR/err" ||
  { echo "FAIL: accel-estimate-memory's error"; cat "$TEST_TMPDIR/err"; exit 1; }
# accel-test: its help, and its known job from a bare environment.
"$prefix/bin/accel-test" --help | grep -q "num_processes=2" ||
  { echo "FAIL: accel-test --help"; exit 1; }
passed=$(env -i HOME="$TEST_TMPDIR" PATH=/usr/bin:/bin TMPDIR="$TEST_TMPDIR" \
           "$prefix/bin/accel-test" 2>&1) ||
  { echo "FAIL: accel-test:"; echo "$passed"; exit 1; }
grep -q "^accel-test: PASS (10 checks in" <<<"$passed" ||
  { echo "FAIL: accel-test printed:"; echo "$passed"; exit 1; }
echo PASS
