#!/bin/bash
# Fault tolerance end to end (tools/ft/soak.py): accel launch
# --fault_tolerance with 4 ranks of examples/ft_train, 3 of them killed with
# SIGKILL at random times and one stopped (SIGSTOP) for 5 s, longer than the
# lighthouse's heartbeat timeout, then continued (it is dropped and joins
# again); the job must exit 0 and its final parameters equal a one-process
# replay of its membership history bit for bit. Then rank 0 killed ends the
# attempt, named, with no replacement started.
set -euo pipefail
cd "${TEST_SRCDIR}/${TEST_WORKSPACE}"
python3 tools/ft/soak.py --bin=. --kills=3 --stops=1 --seed=7 \
    -- --model=mlp --steps=800 --sleep_per_step_ms=20

# Rank 0 hosts the store and the quorum: losing it ends the attempt, named.
out="${TEST_TMPDIR}/rank0.log"
tools/launch --num_processes=3 --fault_tolerance --max_restarts=5 \
    --main_process_port=0 -- examples/ft_train --steps=100000 --print_steps \
    --sleep_per_step_ms=20 > "${out}" 2>&1 &
launcher=$!
for _ in $(seq 100); do
  grep -q "step .* done" "${out}" 2>/dev/null && break
  sleep 0.1
done
sleep 1
for pid in $(pgrep -P "${launcher}"); do
  if grep -qxz "RANK=0" "/proc/${pid}/environ"; then
    kill -9 "${pid}"
  fi
done
# The attempt ends (plain --max_restarts then restarts every rank).
for _ in $(seq 200); do
  grep -q "restarting all ranks" "${out}" && break
  sleep 0.1
done
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
