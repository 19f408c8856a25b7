#!/usr/bin/env python3
"""Kills random ranks of a fault-tolerant job and checks it never stops.

    tools/ft/soak.py --kills=20 --stops=2 --processes=4 -- --model=mlp \
        --steps=3000 --sleep_per_step_ms=20

Starts `launch --fault_tolerance` with examples/ft_train, then, each time
the job is back at full strength, waits a random while and kills (SIGKILL)
a random rank other than 0 (rank 0 hosts the store and the quorum); then
stops (SIGSTOP) one for --stop_seconds and continues it. At the
end: the job's exit code, the time from each kill to the survivors' next
completed step and from each replacement's start to its first step
(min/median/max), and a replay of the run's membership history in one
process, compared bit for bit with the job's final parameters.
"""
import argparse
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

STEP = re.compile(r"step (\d+) done \((\d+) replicas\)")
REPLACEMENT = re.compile(r"starting a replacement")


def rank_pids(launcher_pid):
    """The launcher's children, by their RANK variable."""
    pids = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(
                    item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
            pids[int(env[b"RANK"])] = int(entry)
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return pids


def summary(values):
    if not values:
        return "none"
    return "min %.3f  median %.3f  max %.3f  (n=%d)" % (
        min(values), statistics.median(values), max(values), len(values))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--min_wait", type=float, default=0.5)
    parser.add_argument("--max_wait", type=float, default=2.5)
    parser.add_argument("--stops", type=int, default=0,
                        help="then this many SIGSTOPs of --stop_seconds each")
    parser.add_argument("--stop_seconds", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bin", default="bazel-bin")
    parser.add_argument("--log", default="")
    parser.add_argument("train_flags", nargs="*")
    args = parser.parse_args()
    random.seed(args.seed)
    work = tempfile.mkdtemp(prefix="ft_soak_")
    history, params, replayed = (os.path.join(work, name)
                                 for name in ("history.txt", "params.bin", "replay.bin"))
    train = [f"{args.bin}/examples/ft_train", "--print_steps",
             f"--history_out={history}", f"--params_out={params}"] + args.train_flags
    command = [f"{args.bin}/tools/launch", f"--num_processes={args.processes}",
               "--fault_tolerance", f"--max_restarts={args.kills}",
               "--main_process_port=0", "--"] + train
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, bufsize=1)
    lines = []  # (time, text)
    full = threading.Event()
    # Full again only after a step without the lost rank: a step it had
    # finished can still commit with every replica after the kill.
    degraded = threading.Event()
    log = open(args.log, "w") if args.log else None

    def read():
        for line in job.stdout:
            now = time.monotonic()
            lines.append((now, line.rstrip("\n")))
            if log:
                log.write("%.3f %s" % (now, line))
            m = STEP.search(line)
            if m and int(m.group(2)) < args.processes:
                degraded.set()
            if m and int(m.group(2)) == args.processes and degraded.is_set():
                full.set()

    reader = threading.Thread(target=read)
    reader.start()
    kills = []  # (time, rank)
    stops = []  # (time, rank)
    degraded.set()  # The start counts as a recovery.
    for action in ["kill"] * args.kills + ["stop"] * args.stops:
        if not full.wait(60) or job.poll() is not None:
            break
        full.clear()
        degraded.clear()
        time.sleep(random.uniform(args.min_wait, args.max_wait))
        pids = rank_pids(job.pid)
        candidates = sorted(r for r in pids if r != 0)
        if not candidates or job.poll() is not None:
            break
        rank = random.choice(candidates)
        try:
            if action == "kill":
                os.kill(pids[rank], signal.SIGKILL)
                kills.append((time.monotonic(), rank))
            else:
                # Stopped longer than the lighthouse's heartbeat timeout: it
                # is dropped, and comes back as a joiner when continued.
                os.kill(pids[rank], signal.SIGSTOP)
                stops.append((time.monotonic(), rank))
                time.sleep(args.stop_seconds)
                os.kill(pids[rank], signal.SIGCONT)
        except ProcessLookupError:
            continue
    code = job.wait()
    reader.join()

    steps = [(t, int(m.group(2))) for t, text in lines for m in [STEP.search(text)] if m]
    to_next_step = []
    for killed_at, _ in kills:
        after = [t for t, replicas in steps if t > killed_at and replicas < args.processes]
        if after:
            to_next_step.append(after[0] - killed_at)
    stop_to_next_step = []
    for stopped_at, _ in stops:
        after = [t for t, replicas in steps if t > stopped_at and replicas < args.processes]
        if after:
            stop_to_next_step.append(after[0] - stopped_at)
    to_first_step = []
    for t, text in lines:
        if REPLACEMENT.search(text):
            # A step the lost rank had finished can still commit after the
            # launcher's line: its first step is after a step without it.
            without = [s for s, replicas in steps if s > t and replicas < args.processes]
            after = [s for s, replicas in steps
                     if without and s > without[0] and replicas == args.processes]
            if after:
                to_first_step.append(after[0] - t)
    for t, text in lines:
        if "fault tolerance:" in text or "accel launch:" in text or "error" in text:
            print(text)
    print(f"exit code {code}; {len(kills)} kills (ranks {[r for _, r in kills]}); "
          f"{len(steps)} steps printed")
    print("kill -> survivors' next completed step (s): " + summary(to_next_step))
    print("replacement start -> its first step (s):    " + summary(to_first_step))
    if stops:
        print(f"{len(stops)} stops of {args.stop_seconds} s (ranks {[r for _, r in stops]}); "
              "stop -> survivors' next completed step (s): " + summary(stop_to_next_step))
    replay = subprocess.run([f"{args.bin}/examples/ft_train", f"--replay={history}",
                             f"--params_out={replayed}"] + args.train_flags,
                            capture_output=True, text=True,
                            # As the launcher runs the ranks: MKL's sums
                            # follow its thread count.
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    same = (replay.returncode == 0 and open(params, "rb").read() == open(replayed, "rb").read())
    print("replay of the membership history: " + replay.stdout.strip() +
          ("; final parameters equal bit for bit" if same else "; PARAMETERS DIFFER"))
    done = len(kills) == args.kills and len(stops) == args.stops
    return 0 if code == 0 and same and done else 1


if __name__ == "__main__":
    sys.exit(main())
