"""torch's TCPStore under the join of //tools/bench:rendezvous.

Run by :rendezvous, not by hand:

    python3 torch_rendezvous.py --ranks=4096 --timeout_s=120

The same meeting as accel's (accel/runtime/store/rendezvous.cc), through
c10d's TCPStore: a server in its own process (so that its memory and
threads are its own), and one client per simulated rank, each a thread with
its own connection (TCPStore's calls release the GIL). Each client sets its
key, claims its rank, counts itself in; the last to arrive sets "all", and
every client waits for it. Prints one JSON line: join seconds (from the
start gate to the last client's return), and the server's resident memory
before the clients came, its peak and threads after the join, and the CPU
time it spent on the join.
"""

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import threading
import time

import torch.distributed as dist


def cpu_seconds(pid):
    """User and system time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is the state, field 3 of stat; utime and stime are 14, 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def status(pid):
    """VmRSS, VmHWM in bytes and Threads of a process."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    kib = lambda key: int(fields[key][0]) * 1024
    return kib("VmRSS"), kib("VmHWM"), int(fields["Threads"][0])


def serve():
    store = dist.TCPStore("127.0.0.1", 0, None, True,
                          datetime.timedelta(seconds=600),
                          wait_for_workers=False)
    print(store.port, flush=True)
    sys.stdin.read()  # Until the benchmark closes our stdin.


def raise_file_limit():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--timeout_s", type=int, default=120)
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args()
    raise_file_limit()
    if args.serve:
        serve()
        return
    server = subprocess.Popen([sys.executable, __file__, "--serve"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    port = int(server.stdout.readline())
    rss_before, _, _ = status(server.pid)
    cpu_before = cpu_seconds(server.pid)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    n = args.ranks
    gate = threading.Event()
    done = [0.0] * n
    errors = []
    release = threading.Event()

    def rank(r):
        gate.wait()
        try:
            store = dist.TCPStore("127.0.0.1", port, None, False, timeout)
            store.set(f"accel_join/0/{r}", "127.0.0.1")
            if (store.add(f"accel_join/0/{r}/claimed", 1) == 1 and
                    store.add("accel_join/0/arrived", 1) == n):
                store.set("accel_join/0/all", "")
            store.wait(["accel_join/0/all"])
            done[r] = time.monotonic()
            release.wait()  # Keep the connection until every rank is done.
        except Exception as e:  # Reported, and the run fails.
            errors.append(f"rank {r}: {e}")
            done[r] = time.monotonic()

    threads = [threading.Thread(target=rank, args=(r,), daemon=True)
               for r in range(n)]
    for t in threads:
        t.start()
    start = time.monotonic()
    gate.set()
    while not all(done):
        time.sleep(0.001)
    join = max(done) - start
    _, hwm, server_threads = status(server.pid)
    cpu = cpu_seconds(server.pid) - cpu_before
    release.set()
    for t in threads:
        t.join()
    server.stdin.close()
    server.wait()
    if errors:
        print(f"{len(errors)} ranks failed; first: {errors[0]}",
              file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"join": join, "rss_before": rss_before, "hwm": hwm,
                      "threads": server_threads, "cpu": cpu}))


if __name__ == "__main__":
    main()
