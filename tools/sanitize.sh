#!/usr/bin/env bash
# The sanitizer passes of CI over the LibTorch-free runtime and backends,
# whose six kinds of thread (communicator workers, watchdogs, store server
# and client, shared-memory waiters, Gloo's loop, the launcher's relays)
# are where data races would be.
#
#   tools/sanitize.sh asan   # AddressSanitizer + UndefinedBehaviorSanitizer
#   tools/sanitize.sh tsan   # ThreadSanitizer
#
# Extra arguments go to bazel test (with flags only, the targets stay the
# runtime and backends). Prints the elapsed time.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -eq 0 ]]; then
  echo "usage: tools/sanitize.sh asan|tsan [bazel test flags] [targets]" >&2
  exit 2
fi
kind=$1
shift
targets=("$@")
# Flags alone keep the default targets.
has_target=0
for argument in "$@"; do
  [[ "$argument" == -* ]] || has_target=1
done
if ((has_target == 0)); then
  targets+=(//accel/runtime/... //backends/...)
fi
case "$kind" in
  asan)
    options=(--config=asan
             --test_env=ASAN_OPTIONS=detect_stack_use_after_return=1
             --test_env=UBSAN_OPTIONS=print_stacktrace=1) ;;
  tsan)
    options=(--config=tsan
             "--test_env=TSAN_OPTIONS=halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tools/sanitizers/tsan.supp") ;;
  *) echo "tools/sanitize.sh: unknown kind '$kind' (asan or tsan)" >&2; exit 2 ;;
esac
# Sanitized tests run 2-15 times slower (TSan most): Bazel's timeouts per
# size (60, 300, 900, 3600 s) tripled, the last kept.
options+=(--test_timeout=180,900,2700,3600)
# The conformance suites' largest count, 1M elements of every dtype, is
# written and checked element by element, instrumented: under TSan on 2
# cores the gloo suite's 8 shards took 97-561 s each, two over 700 s
# (world size 4). With 64K elements (256 KiB of float32, still several
# slots; the tiny-slot backends span hundreds) they take 14-67 s, 350 s in
# all, and the whole TSan pass 288 s once built.
options+=(--test_env=ACCEL_CONFORMANCE_LARGE_COUNT=65536)
# Four ranks on two cores, every thread slowed by the sanitizer, took 126 of
# the backends' 446 s of testing under TSan and 29 of 171 s under ASan;
# three ranks keep the races of several peers on one host and of a rank
# alone on the other (the two-host variants: 2 + 1).
options+=(--test_env=ACCEL_CONFORMANCE_MAX_WORLD_SIZE=3)
start=$(date +%s)
status=0
bazel test "${options[@]}" "${targets[@]}" || status=$?
echo "tools/sanitize.sh $kind: $(( $(date +%s) - start )) s, exit $status"
exit $status
