"""Baseline for //tools/bench:collectives: the same measurements with
torch.distributed's Gloo backend (Debian's python3-torch).

Run by the C++ benchmark as `/usr/bin/python3 torch_collectives.py
--world_size=N --sizes=...`; prints one JSON object on stdout (rank 0):
{"name": median_seconds, ...} with the same names as the C++ side.
"""
import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def timed(fn, iterations, warmup=3):
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def worker(rank, world_size, port, sizes, latency_iterations, queue):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
        world_size=world_size)
    results = {}
    results["barrier"] = timed(dist.barrier, latency_iterations)
    small = torch.arange(3, dtype=torch.int64)
    gathered = [torch.empty_like(small) for _ in range(world_size)]

    def gather_small():
        dist.all_gather(gathered, small)
        torch.cat(gathered)

    results["allgather_3xint64"] = timed(gather_small, latency_iterations)
    one = torch.ones(1, dtype=torch.float32)
    results["allreduce_1xfloat32"] = timed(
        lambda: dist.all_reduce(one), latency_iterations)
    for size in sizes:
        count = size // 4
        iterations = max(3, min(50, (256 << 20) // size))
        buffer = torch.ones(count, dtype=torch.float32)
        outputs = [torch.empty_like(buffer) for _ in range(world_size)]
        results[f"allgather_{size}"] = timed(
            lambda: dist.all_gather(outputs, buffer), iterations)
        results[f"allreduce_{size}"] = timed(
            lambda: dist.all_reduce(buffer), iterations)
    dist.barrier()
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--sizes", default="4096,65536,1048576,16777216,67108864")
    parser.add_argument("--latency_iterations", type=int, default=200)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(
        worker, args=(args.world_size, port, sizes, args.latency_iterations,
                      queue),
        nprocs=args.world_size, join=True, start_method="spawn")
    print(json.dumps(queue.get()))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
