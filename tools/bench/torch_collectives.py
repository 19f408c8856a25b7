"""Baseline for //tools/bench:collectives: the same rows, timed the same way
(tools/bench/rows.h), with torch.distributed's Gloo backend (Debian's
python3-torch).

Run by the C++ benchmark as `/usr/bin/python3 torch_collectives.py
--world_size=N --sizes=... --rounds=R`; rank 0 prints one JSON object as the
last line: {"key": [round medians in seconds], ...}.
"""
import argparse
import json
import os
import resource
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def context_switches():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def timed_rounds(results, key, fn, iterations, rounds, warmup=3):
    """Stores each round's median call time, and its context switches per
    call (over all threads), as rows.h does."""
    for _ in range(warmup):
        fn()
    medians = []
    switches = []
    for _ in range(rounds):
        dist.barrier()
        samples = []
        before = context_switches()
        for _ in range(iterations):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        switches.append((context_switches() - before) / iterations)
        medians.append(statistics.median(samples))
    results[key] = medians
    results[key + ":switches"] = switches


def iterations_for(size):
    return max(3, min(50, (256 << 20) // size))


def worker(rank, world_size, port, sizes, latency_iterations, rounds, queue):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
        world_size=world_size)
    results = {}
    timed_rounds(results, "barrier", dist.barrier, latency_iterations, rounds)
    small = torch.arange(3, dtype=torch.int64)
    gathered = [torch.empty_like(small) for _ in range(world_size)]
    timed_rounds(results, "allgather_3xint64",
                 lambda: dist.all_gather(gathered, small), latency_iterations,
                 rounds)
    one = torch.ones(1, dtype=torch.float32)
    timed_rounds(results, "allreduce_1xfloat32", lambda: dist.all_reduce(one),
                 latency_iterations, rounds)
    for size in sizes:
        buffer = torch.ones(size // 4, dtype=torch.float32)
        outputs = [torch.empty_like(buffer) for _ in range(world_size)]
        timed_rounds(results, f"allgather_{size}",
                     lambda: dist.all_gather(outputs, buffer),
                     iterations_for(size), rounds)
    for size in sizes:
        buffer = torch.ones(size // 4, dtype=torch.float32)
        timed_rounds(results, f"allreduce_{size}",
                     lambda: dist.all_reduce(buffer), iterations_for(size),
                     rounds)
    for size in sizes:
        output = torch.empty(size // 4, dtype=torch.float32)
        inputs = [torch.ones_like(output) for _ in range(world_size)]
        try:
            timed_rounds(results, f"reduce_scatter_{size}",
                         lambda: dist.reduce_scatter(output, inputs),
                         iterations_for(size), rounds)
        except RuntimeError:
            break  # Gloo in torch 1.13 has no reduce_scatter: n/a.
    dist.barrier()
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--sizes", default="4096,65536,1048576,16777216,67108864")
    parser.add_argument("--latency_iterations", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(
        worker, args=(args.world_size, port, sizes, args.latency_iterations,
                      args.rounds, queue),
        nprocs=args.world_size, join=True, start_method="spawn")
    print(json.dumps(queue.get()))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
