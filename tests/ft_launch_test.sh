#!/bin/bash
# Fault tolerance end to end (tools/ft/soak.py): accel launch
# --fault_tolerance with 4 ranks of examples/ft_train, 3 of them killed with
# SIGKILL at random times and one stopped (SIGSTOP) for 5 s, longer than the
# lighthouse's heartbeat timeout, then continued (it is dropped and joins
# again); the job must exit 0 and its final parameters equal a one-process
# replay of its membership history bit for bit. Then: a loss with no
# replacements left, a rank stopped for good, and rank 0 killed, which ends
# the attempt, named, with no replacement started.
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
python3 tools/ft/soak.py --bin=. --kills=3 --stops=1 --seed=7 \
    -- --model=mlp --steps=1500 --sleep_per_step_ms=20

# Signals `signal` to the process of RANK=`rank` among the children of
# launcher `pid`.
signal_rank() {
  local launcher=$1 rank=$2 signal=$3
  for pid in $(pgrep -P "${launcher}"); do
    if grep -qxz "RANK=${rank}" "/proc/${pid}/environ"; then
      kill "-${signal}" "${pid}"
    fi
  done
}

# Waits up to `tenths` tenths of a second for `pattern` in file `log`.
await_line() {
  local log=$1 pattern=$2 tenths=$3
  for _ in $(seq "${tenths}"); do
    grep -q "${pattern}" "${log}" 2>/dev/null && return 0
    sleep 0.1
  done
}

# Without replacements left (--max_restarts=0) the others train on without
# the lost rank; a rank stopped for good (SIGSTOP) is dropped, and once rank
# 0 has finished the launcher stops it rather than wait forever.
for case in kill stop; do
  out="${TEST_TMPDIR}/${case}.log"
  tools/launch --num_processes=4 --fault_tolerance --main_process_port=0 \
      -- examples/ft_train --steps=300 --print_steps \
      --sleep_per_step_ms=20 > "${out}" 2>&1 &
  launcher=$!
  await_line "${out}" "step 20 done" 100
  if [[ "${case}" == kill ]]; then
    signal_rank "${launcher}" 3 KILL
  else
    signal_rank "${launcher}" 2 STOP
  fi
  wait "${launcher}" ||
    { echo "FAIL: ${case}: the job failed"; cat "${out}"; exit 1; }
  grep -q "300 steps here" "${out}" ||
    { echo "FAIL: ${case}: the training did not end"; cat "${out}"; exit 1; }
done
grep -q "the others train on without it (no replacements left" \
  "${TEST_TMPDIR}/kill.log" ||
  { echo "FAIL: the loss without replacements"; cat "${TEST_TMPDIR}/kill.log"; exit 1; }
grep -q "stopping the ranks still running: rank 2" "${TEST_TMPDIR}/stop.log" ||
  { echo "FAIL: the stopped rank"; cat "${TEST_TMPDIR}/stop.log"; exit 1; }

# Rank 0 hosts the store and the quorum: losing it ends the attempt, named.
out="${TEST_TMPDIR}/rank0.log"
tools/launch --num_processes=3 --fault_tolerance --max_restarts=5 \
    --main_process_port=0 -- examples/ft_train --steps=100000 --print_steps \
    --sleep_per_step_ms=20 > "${out}" 2>&1 &
launcher=$!
await_line "${out}" "step .* done" 100
sleep 1
signal_rank "${launcher}" 0 KILL
# The attempt ends (plain --max_restarts then restarts every rank).
await_line "${out}" "restarting all ranks" 200
# Its children first: once it is gone they would belong to init.
pkill -9 -P "${launcher}" 2>/dev/null || true
kill -9 "${launcher}" 2>/dev/null || true
wait "${launcher}" 2>/dev/null || true
grep -q "rank 0 (pid [0-9]*) was killed by signal 9" "${out}" ||
  { echo "FAIL: rank 0's loss not named"; cat "${out}"; exit 1; }
grep -q "the store's host (rank 0) is gone" "${out}" ||
  { echo "FAIL: the others did not say why they stopped"; cat "${out}"; exit 1; }
grep -q "restarting all ranks" "${out}" ||
  { echo "FAIL: the attempt did not end"; cat "${out}"; exit 1; }
if grep -q "starting a replacement" "${out}"; then
  echo "FAIL: a rank was replaced after rank 0 was lost"; cat "${out}"; exit 1
fi
echo "PASS"
