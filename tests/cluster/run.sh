#!/usr/bin/env bash
# End-to-end tests under the engines clusters run: a real single-node SLURM
# (munged, slurmctld, slurmd started here), Open MPI's mpirun, torchrun in
# its default and standalone modes, and two "machines" (network namespaces
# joined by a veth pair; iptables makes one vanish). Prints one PASS/FAIL
# line per case, then the rendezvous times of 8 to 256 ranks; exits non-zero
# on any FAIL. Run by .ci/run after `bazel test //...`, as root:
#
#   bash tests/cluster/run.sh            # every case
#   bash tests/cluster/run.sh slurm      # only cases whose name matches
#
# Everything it starts (daemons, namespaces, jobs) is stopped and removed on
# every exit path; traffic stays on loopback and inside its namespaces.
set -uo pipefail
cd "$(dirname "$0")/../.."

FILTER="${1:-}"
readonly START=$(date +%s)
readonly WORK=$(mktemp -d /tmp/accel-cluster.XXXXXX)
chmod 755 "$WORK"
readonly NS0="accel$$m0" NS1="accel$$m1"
readonly IP0=10.231.0.1 IP1=10.231.0.2
PIDS=()     # Background processes this script started.
FAILS=0
SLURM_UP=0
NETNS_UP=0

log() { echo "cluster: $*" >&2; }

cleanup() {
  exec 2>/dev/null  # No job-control notes about what is killed here.
  local pid
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  for f in "$WORK"/slurm/slurmd.pid "$WORK"/slurm/slurmctld.pid \
    "$WORK"/munge/munged.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null
  done
  if [ "$NETNS_UP" = 1 ]; then
    ip netns delete "$NS0" 2>/dev/null
    ip netns delete "$NS1" 2>/dev/null
  fi
  sleep 0.2
  for f in "$WORK"/slurm/slurmd.pid "$WORK"/slurm/slurmctld.pid \
    "$WORK"/munge/munged.pid; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$(id -u)" -ne 0 ]; then
  echo "tests/cluster/run.sh: needs root (munged, slurmd, ip netns)" >&2
  exit 2
fi

# ---------------------------------------------------------------- helpers

wanted() { [ -z "$FILTER" ] || [[ "$1" == *"$FILTER"* ]]; }

pass() { printf 'PASS %-44s %s\n' "$1" "${2:-}"; }
fail() {
  printf 'FAIL %-44s %s\n' "$1" "$2"
  FAILS=$((FAILS + 1))
  local log
  for log in "${@:3}"; do  # Each log named shows its last lines.
    [ -f "$log" ] || continue
    [ $# -gt 3 ] && echo "    $(basename "$log"):"
    sed 's/^/    | /' "$log" | tail -15
  done
}

# The lines of a run that must not depend on how it was started (those that
# match the pattern $2), sorted.
results() {  # output pattern
  sed -E 's/^\[default[0-9]+\]://' "$1" | grep -E "^($2)" | sort
}

# Compares a run's results with a single-host reference's.
compare_results() {  # name reference output pattern
  local expected actual
  expected=$(results "$2" "$4")
  actual=$(results "$3" "$4")
  if [ -z "$expected" ]; then
    fail "$1" "the single-host reference printed no results" "$2"
  elif [ "$expected" = "$actual" ]; then
    pass "$1" "($(echo "$expected" | wc -l) result lines match the single host)"
  else
    fail "$1" "results differ from the single host" "$3"
  fi
}

same_results() {  # name reference output
  compare_results "$@" \
    'Epoch [0-9]+ - Accuracy|Parameter fingerprint|Gathered tensor'
}

# Machines sum the gradients in another order than one host (each machine's
# ranks through shared memory, then the machines), so the parameters can
# differ in their last bits: the accuracies and the parameters' norm (7
# digits) must match instead of the fingerprint.
same_results_across_machines() {  # name reference output
  compare_results "$@" 'Epoch [0-9]+ - Accuracy|Parameter norm'
}

seconds_since() { echo $(($(date +%s) - $1)); }

BIN=bazel-bin
TRAIN="$PWD/$BIN/examples/train_demo"
GATHER="$PWD/$BIN/examples/gather_demo"
WORKER="$PWD/$BIN/tests/mp_worker"
LAUNCH="$PWD/$BIN/tools/launch"
TRAIN_ARGS=(--epochs=2 --progress=false)

log "building the programs"
if ! bazel build //examples:train_demo //examples:gather_demo \
  //tests:mp_worker //tools:launch >"$WORK/build.log" 2>&1; then
  cat "$WORK/build.log" >&2
  exit 1
fi

# Single-host references, through accel's own launcher.
"$TRAIN" --num_processes=2 --main_process_port=0 "${TRAIN_ARGS[@]}" \
  --output_dir="$WORK/ref2" >"$WORK/ref2.log" 2>&1
"$TRAIN" --num_processes=4 --main_process_port=0 "${TRAIN_ARGS[@]}" \
  --output_dir="$WORK/ref4" >"$WORK/ref4.log" 2>&1
"$GATHER" --num_processes=3 --main_process_port=0 >"$WORK/gather3.log" 2>&1

# ------------------------------------------------------------------ SLURM

start_slurm() {
  local node=$(hostname)
  getent hosts "$node" >/dev/null || node=localhost
  mkdir -p "$WORK/munge" "$WORK/slurm/spool" "$WORK/slurm/state"
  chown munge:munge "$WORK/munge" && chmod 711 "$WORK/munge"
  head -c 1024 /dev/urandom >"$WORK/munge/munge.key"
  chown munge:munge "$WORK/munge/munge.key" && chmod 400 "$WORK/munge/munge.key"
  runuser -u munge -- munged --socket="$WORK/munge/socket" \
    --key-file="$WORK/munge/munge.key" --pid-file="$WORK/munge/munged.pid" \
    --log-file="$WORK/munge/munged.log" --seed-file="$WORK/munge/seed" ||
    return 1
  # Found by trial on Debian's slurm-wlm 22.05 (see shared/toolchain.md):
  # linuxproc process tracking, no task plugin, absolute paths everywhere.
  cat >"$WORK/slurm/slurm.conf" <<EOF
ClusterName=accel
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
AuthInfo=socket=$WORK/munge/socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldPidFile=$WORK/slurm/slurmctld.pid
SlurmdPidFile=$WORK/slurm/slurmd.pid
SlurmdSpoolDir=$WORK/slurm/spool
StateSaveLocation=$WORK/slurm/state
SlurmctldLogFile=$WORK/slurm/slurmctld.log
SlurmdLogFile=$WORK/slurm/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=16 State=UNKNOWN
PartitionName=accel Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  echo "CgroupPlugin=cgroup/v1" >"$WORK/slurm/cgroup.conf"
  export SLURM_CONF="$WORK/slurm/slurm.conf"
  slurmctld -D -f "$SLURM_CONF" >"$WORK/slurm/ctld.out" 2>&1 &
  PIDS+=($!)
  slurmd -D -N "$node" -f "$SLURM_CONF" >"$WORK/slurm/d.out" 2>&1 &
  PIDS+=($!)
  SLURM_UP=1
  local i
  for i in $(seq 100); do
    sinfo -h -o %T 2>/dev/null | grep -q idle && return 0
    sleep 0.2
  done
  return 1
}

if wanted slurm; then
  if ! start_slurm; then
    fail slurm_cluster_starts "munged/slurmctld/slurmd did not come up" \
      "$WORK/slurm/slurmctld.log"
  else
    pass slurm_cluster_starts "($(sinfo -h -o '%D node, %c CPUs'))"
    timeout 120 srun -n 2 "$TRAIN" "${TRAIN_ARGS[@]}" \
      --output_dir="$WORK/slurm2" >"$WORK/slurm2.log" 2>&1
    same_results "slurm: srun -n 2 train_demo" "$WORK/ref2.log" "$WORK/slurm2.log"
    timeout 120 srun -n 3 "$GATHER" >"$WORK/slurm3.log" 2>&1
    same_results "slurm: srun -n 3 gather_demo" "$WORK/gather3.log" \
      "$WORK/slurm3.log"
    # SLURM's warning before it stops a job (scancel --signal, as
    # --signal=USR1@60 sends it): each task saves at the same step and
    # exits 75; srun --resume then ends where an uninterrupted run does.
    PRE_ARGS=(--epochs=6 --sleep_per_step_ms=60 --progress=false)
    "$TRAIN" --num_processes=2 --main_process_port=0 "${PRE_ARGS[@]}" \
      --output_dir="$WORK/pre_ref" >"$WORK/pre_ref.log" 2>&1
    timeout 120 srun -n 2 -J accel-preempt "$TRAIN" "${PRE_ARGS[@]}" \
      --output_dir="$WORK/slurm_pre" --resume >"$WORK/slurm_pre.log" 2>&1 &
    srun_pid=$!
    for i in $(seq 300); do
      [ -f "$WORK/slurm_pre/checkpoints/checkpoint_1/accelerator_state.pt" ] &&
        break
      sleep 0.1
    done
    sleep 0.3
    scancel --signal=USR1 --name=accel-preempt
    wait $srun_pid
    rc=$?
    if [ $rc = 75 ] && grep -q "Preempted by SIGUSR1" "$WORK/slurm_pre.log"; then
      timeout 120 srun -n 2 "$TRAIN" "${PRE_ARGS[@]}" \
        --output_dir="$WORK/slurm_pre" --resume >>"$WORK/slurm_pre.log" 2>&1
      same_results "slurm: scancel --signal=USR1, srun --resume" \
        "$WORK/pre_ref.log" "$WORK/slurm_pre.log"
    else
      fail "slurm: scancel --signal=USR1, srun --resume" \
        "srun exit $rc, expected 75 and a save" "$WORK/slurm_pre.log"
    fi
    # A batch step is one process, not rank 0 of two: it says so, runs.
    timeout 60 salloc -n 2 "$GATHER" >"$WORK/salloc.log" 2>&1
    if grep -q "srun did not start this process" "$WORK/salloc.log" &&
      grep -q "Gathered tensor" "$WORK/salloc.log"; then
      pass "slurm: salloc without srun warns" ""
    else
      fail "slurm: salloc without srun warns" "no warning or no result" \
        "$WORK/salloc.log"
    fi
  fi
fi

# --------------------------------------------------------------- Open MPI

if wanted mpi; then
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$TRAIN" \
    "${TRAIN_ARGS[@]}" --output_dir="$WORK/mpi2" >"$WORK/mpi2.log" 2>&1
  same_results "mpi: mpirun -np 2 train_demo" "$WORK/ref2.log" "$WORK/mpi2.log"
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 3 "$GATHER" \
    >"$WORK/mpi3.log" 2>&1
  same_results "mpi: mpirun -np 3 gather_demo" "$WORK/gather3.log" \
    "$WORK/mpi3.log"
fi

# --------------------------------------------------------------- torchrun

if wanted torchrun; then
  # Debian's torchrun (Python 3.11) needs --redirects/--tee (Std.from_str).
  TORCHRUN=(/usr/bin/torchrun --nproc_per_node=2 --redirects=1 --tee=1
    --no_python)
  port=$((20000 + RANDOM % 5000))
  timeout 120 "${TORCHRUN[@]}" --master_port=$port "$TRAIN" \
    "${TRAIN_ARGS[@]}" --output_dir="$WORK/torchrun" >"$WORK/torchrun.log" 2>&1
  same_results "torchrun: default mode (agent's store)" "$WORK/ref2.log" \
    "$WORK/torchrun.log"
  timeout 120 "${TORCHRUN[@]}" --standalone "$TRAIN" "${TRAIN_ARGS[@]}" \
    --output_dir="$WORK/standalone" >"$WORK/standalone.log" 2>&1
  same_results "torchrun: --standalone" "$WORK/ref2.log" "$WORK/standalone.log"
fi

# ------------------------------------------------------ partial variables

if wanted partial; then
  t=$(date +%s)
  env SLURM_STEP_ID=0 SLURM_PROCID=1 SLURM_NTASKS=2 timeout 60 "$TRAIN" \
    "${TRAIN_ARGS[@]}" --output_dir="$WORK/partial" >"$WORK/partial.log" 2>&1
  rc=$?
  if [ $rc = 1 ] && grep -q "SLURM_LOCALID, SLURM_NODEID" "$WORK/partial.log" &&
    ! grep -q Accuracy "$WORK/partial.log"; then
    pass "partial SLURM variables: one clear error" "($(seconds_since "$t") s)"
  else
    fail "partial SLURM variables: one clear error" "exit $rc" \
      "$WORK/partial.log"
  fi
fi

# ---------------------------------------------------- two-machine network

start_netns() {
  ip netns add "$NS0" && ip netns add "$NS1" || return 1
  NETNS_UP=1
  ip link add "acc$$a" type veth peer name "acc$$b" &&
    ip link set "acc$$a" netns "$NS0" && ip link set "acc$$b" netns "$NS1" &&
    ip -n "$NS0" addr add $IP0/24 dev "acc$$a" &&
    ip -n "$NS1" addr add $IP1/24 dev "acc$$b" &&
    ip -n "$NS0" link set "acc$$a" up && ip -n "$NS1" link set "acc$$b" up &&
    ip -n "$NS0" link set lo up && ip -n "$NS1" link set lo up
}

# machine NS RANK LOG ARGS...: one machine's launcher (2 of 4 ranks).
machine() {
  local ns=$1 rank=$2 out=$3
  shift 3
  ip netns exec "$ns" timeout 150 "$TRAIN" --num_processes=4 \
    --num_machines=2 --machine_rank="$rank" --main_process_ip=$IP0 \
    --progress=false "$@" >"$out" 2>&1
}

# Runs both machines; returns once both launchers exited (times in files).
two_machines() {  # name args-for-both... ; env SECRET0/SECRET1 may differ
  local name=$1
  shift
  local t=$(date +%s)
  (ACCEL_RUN_SECRET=$SECRET0 machine "$NS0" 0 "$WORK/$name.m0" "$@"
    echo "exit=$? after=$(seconds_since "$t")" >>"$WORK/$name.m0") &
  local pid0=$!
  (ACCEL_RUN_SECRET=$SECRET1 machine "$NS1" 1 "$WORK/$name.m1" "$@"
    echo "exit=$? after=$(seconds_since "$t")" >>"$WORK/$name.m1") &
  local pid1=$!
  PIDS+=($pid0 $pid1)
  wait $pid0 $pid1
}

after() { sed -n 's/^exit=[0-9]* after=\([0-9]*\)$/\1/p' "$1"; }
exit_of() { sed -n 's/^exit=\([0-9]*\) after=.*$/\1/p' "$1"; }

if wanted machines; then
  if ! start_netns; then
    fail "machines: namespaces and veth" "ip netns/veth failed"
  else
    export SECRET0=cluster-secret SECRET1=cluster-secret
    port=29611

    two_machines train --main_process_port=$port "${TRAIN_ARGS[@]}" \
      --output_dir="$WORK/two"
    cat "$WORK/train.m0" "$WORK/train.m1" >"$WORK/train.both"
    same_results_across_machines "machines: 2x2 train_demo" "$WORK/ref4.log" \
      "$WORK/train.both"

    # Machine 1 never starts: machine 0 gives up at the rendezvous timeout.
    t=$(date +%s)
    ACCEL_RUN_SECRET=$SECRET0 machine "$NS0" 0 "$WORK/alone.log" \
      --main_process_port=$((port + 1)) --rendezvous_timeout_s=5 \
      "${TRAIN_ARGS[@]}" --output_dir="$WORK/alone"
    took=$(seconds_since "$t")
    if grep -q "ranks 2, 3 (machine 1, at 2 ranks per machine) did not join" \
      "$WORK/alone.log" && [ "$took" -lt 25 ]; then
      pass "machines: missing machine named at timeout" "(${took} s, timeout 5 s)"
    else
      fail "machines: missing machine named at timeout" "${took} s" \
        "$WORK/alone.log"
    fi

    # Machine 1 reaches the store but no data port: the join still ends at
    # the rendezvous timeout, naming the unreachable address.
    p=$((port + 2))
    x="ip netns exec $NS1 iptables"
    $x -A OUTPUT -p tcp --dport $p -j ACCEPT && $x -A INPUT -p tcp --sport $p -j ACCEPT &&
      $x -A OUTPUT -p tcp -d $IP0 -j DROP && $x -A INPUT -p tcp -s $IP0 -j DROP
    two_machines blocked --main_process_port=$p --rendezvous_timeout_s=8 \
      "${TRAIN_ARGS[@]}" --output_dir="$WORK/blocked"
    $x -F
    if grep -q "accepted no data connection within the rendezvous timeout" \
      "$WORK/blocked.m0" "$WORK/blocked.m1" &&
      [ "$(after "$WORK/blocked.m0")" -lt 30 ]; then
      pass "machines: blocked data ports end at the timeout" \
        "($(after "$WORK/blocked.m0") s, timeout 8 s)"
    else
      fail "machines: blocked data ports end at the timeout" \
        "$(after "$WORK/blocked.m0") s" "$WORK/blocked.m0"
    fi

    # Another secret on machine 1: both sides say so. Machine 1 fails at
    # once; machine 0 names the refusal at once and at its rendezvous
    # timeout (a stranger's hello must not end a job, so it waits).
    SECRET1=another-secret two_machines secret --main_process_port=$((port + 3)) \
      --rendezvous_timeout_s=10 "${TRAIN_ARGS[@]}" --output_dir="$WORK/secret"
    if grep -q "a process from $IP1 claiming rank [23] was refused (another run secret)" \
      "$WORK/secret.m0" && grep -q "rejected this process: it belongs to another run" \
      "$WORK/secret.m1" && [ "$(after "$WORK/secret.m0")" -lt 30 ]; then
      pass "machines: secret mismatch on both sides" "($(after "$WORK/secret.m0") s)"
    else
      fail "machines: secret mismatch on both sides" "" "$WORK/secret.m0"
    fi

    # A machine vanishes mid-training (packets dropped, then killed): the
    # other names its ranks within 30 s. Both directions: machine 1, and
    # machine 0, which hosts the store.
    for gone in 1 0; do
      name=vanish$gone
      ns_gone=$([ $gone = 1 ] && echo "$NS1" || echo "$NS0")
      ns_left=$([ $gone = 1 ] && echo "$NS0" || echo "$NS1")
      p=$((port + 4 + gone))
      (ACCEL_RUN_SECRET=$SECRET0 machine "$NS0" 0 "$WORK/$name.m0" \
        --main_process_port=$p --epochs=10000 --sleep_per_step_ms=20 \
        --output_dir="$WORK/$name" ; echo "exit=$? at=$(date +%s)" >>"$WORK/$name.m0") 2>/dev/null &
      pid0=$!
      (ACCEL_RUN_SECRET=$SECRET0 machine "$NS1" 1 "$WORK/$name.m1" \
        --main_process_port=$p --epochs=10000 --sleep_per_step_ms=20 \
        --output_dir="$WORK/$name" ; echo "exit=$? at=$(date +%s)" >>"$WORK/$name.m1") 2>/dev/null &
      pid1=$!
      PIDS+=($pid0 $pid1)
      started=0
      for i in $(seq 100); do
        grep -q "Epoch 2 " "$WORK/$name.m0" "$WORK/$name.m1" 2>/dev/null &&
          started=1 && break
        sleep 0.3
      done
      if [ $started = 0 ]; then
        fail "machines: machine $gone vanishes, named" \
          "training did not reach epoch 2 within 30 s" "$WORK/$name.m0" \
          "$WORK/$name.m1"
        for pid in $(ip netns pids "$NS0") $(ip netns pids "$NS1"); do
          kill -9 "$pid" 2>/dev/null
        done
        wait $pid0 $pid1 2>/dev/null
        continue
      fi
      vanished=$(date +%s)
      ip netns exec "$ns_gone" iptables -A INPUT -j DROP
      ip netns exec "$ns_gone" iptables -A OUTPUT -j DROP
      # Kill the vanished machine's launcher and ranks (by pid, in its
      # namespace); its FIN/RST packets are dropped.
      for pid in $(ip netns pids "$ns_gone"); do kill -9 "$pid" 2>/dev/null; done
      left_log="$WORK/$name.m$([ $gone = 1 ] && echo 0 || echo 1)"
      # Machine 1 runs ranks 2 and 3: the first of them whose connection
      # fails is named unreachable (the other may still read as not
      # responding, by the status it stopped updating).
      if [ $gone = 1 ]; then
        expect="rank [23] is unreachable \(its machine ${IP1//./\\.} stopped answering"
      else
        expect="rank 0's machine stopped answering on the network"
      fi
      # When the surviving ranks say so (not counting the launcher's grace).
      took=999
      for i in $(seq 600); do
        if grep -qE "$expect" "$left_log" 2>/dev/null; then
          took=$(seconds_since "$vanished")
          break
        fi
        sleep 0.1
      done
      wait $pid0 $pid1 2>/dev/null
      ip netns exec "$ns_gone" iptables -F
      if [ "$took" -le 30 ]; then
        pass "machines: machine $gone vanishes, named" "(${took} s after it vanished; limit 30 s)"
      else
        fail "machines: machine $gone vanishes, named" "${took} s" "$left_log" \
          "$WORK/$name.m$gone"
      fi
    done
  fi
fi

# --------------------------------------------------------------- launcher

if wanted launcher; then
  "$WORKER" --num_processes=2 --main_process_port=0 --scenario=sleep \
    >"$WORK/names.log" 2>&1 &
  pid=$!
  PIDS+=($pid)
  for i in $(seq 100); do
    [ "$(pgrep -c -x -P "$pid" mp_worker)" = 2 ] && break
    sleep 0.1
  done
  count=$(pgrep -c -x -P "$pid" mp_worker)
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null
  if [ "$count" = 2 ]; then
    pass "launcher: pgrep -x finds the ranks by name" ""
  else
    fail "launcher: pgrep -x finds the ranks by name" "found ${count:-0} of 2"
  fi
fi

if wanted rendezvous; then
  TIMES=""
  for n in 8 32 128 256; do
    t=$(date +%s%N)
    timeout 300 "$LAUNCH" --num_processes=$n --main_process_port=0 -- \
      "$WORKER" --scenario=rendezvous --timeout_ms=240000 \
      >"$WORK/rdzv$n.log" 2>&1
    rc=$?
    wall=$((($(date +%s%N) - t) / 1000000))
    join=$(sed -n 's/^rendezvous of [0-9]* ranks: \([0-9]*\) ms$/\1/p' \
      "$WORK/rdzv$n.log")
    if [ $rc = 0 ] && [ -n "$join" ]; then
      pass "rendezvous: $n ranks on one host" \
        "(rank 0 joined in $join ms; launch to exit $wall ms)"
      TIMES+="$n ranks: rank 0's join $join ms, whole job $wall ms; "
    else
      fail "rendezvous: $n ranks on one host" "exit $rc" "$WORK/rdzv$n.log"
    fi
  done
fi

echo "cluster: $FAILS failed; $(seconds_since "$START") s in all"
[ "$FAILS" = 0 ]
