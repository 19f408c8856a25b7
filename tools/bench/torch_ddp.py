"""Baseline for //tools/bench:ddp: the same training step with torch's
DistributedDataParallel over Gloo (Debian's python3-torch).

Run by the C++ benchmark as `/usr/bin/python3 torch_ddp.py --world_size=N
--model=mlp ...`; rank 0 prints one JSON object as its last line, with the
same names as the C++ side:
  step_sync    median seconds of one optimizer step (gradient_accumulation_steps
               micro-batches, forward, backward, gradient sync, AdamW, zero_grad)
  step_nosync  the same under ddp.no_sync(): no communication at all
  sync_alone   the gradient sync alone: DDP's buckets allreduced together
               (async, then waited) and divided by the world size
  optimizer    AdamW's step alone (inside the synced steps)
  buckets      DDP's bucket count
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import torch_ranks

BATCH = 32


def build(model_name):
    """The models and batches of tools/bench/ddp.cc."""
    torch.manual_seed(0)
    if model_name == "mlp":
        model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(),
                              nn.Linear(4096, 4096), nn.ReLU(),
                              nn.Linear(4096, 1024))
        inputs = torch.randn(BATCH, 1024)
        labels = torch.randint(0, 1024, (BATCH,))
    elif model_name == "conv":
        model = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(),
            nn.Linear(256, 10))
        inputs = torch.randn(BATCH, 3, 32, 32)
        labels = torch.randint(0, 10, (BATCH,))
    else:
        raise SystemExit(f"--model: expected mlp or conv, found {model_name}")
    return model, inputs, labels


def worker(rank, args, port, queue):
    torch.set_num_threads(args.threads)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
        world_size=args.world_size)
    model, inputs, labels = build(args.model)
    ddp = nn.parallel.DistributedDataParallel(
        model, gradient_as_bucket_view=args.gradient_as_bucket_view)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    optimizer_seconds = []

    def micro_step():
        loss = F.cross_entropy(ddp(inputs), labels)
        loss = loss / args.gradient_accumulation_steps
        loss.backward()

    def step(sync):
        for micro in range(args.gradient_accumulation_steps):
            if sync and micro == args.gradient_accumulation_steps - 1:
                micro_step()
            else:
                with ddp.no_sync():
                    micro_step()
        start = time.perf_counter()
        optimizer.step()
        optimizer_seconds.append(time.perf_counter() - start)
        optimizer.zero_grad()

    for _ in range(args.warmup):
        step(True)
    # DDP's buckets after its first iterations: assigned in the order in
    # which gradients become ready (reverse of the layers here), with a small
    # first bucket.
    ready_order = list(reversed(list(ddp.parameters())))
    bucket_indices, _ = dist._compute_bucket_assignment_by_size(
        ready_order, [dist._DEFAULT_FIRST_BUCKET_BYTES, ddp.bucket_bytes_cap])
    bucket_buffers = [
        torch.ones(sum(ready_order[i].numel() for i in bucket))
        for bucket in bucket_indices]

    def sync_alone():
        works = [dist.all_reduce(b, async_op=True) for b in bucket_buffers]
        for work, buffer in zip(works, bucket_buffers):
            work.wait()
            buffer.div_(args.world_size)

    samples = {"step_sync": [], "step_nosync": [], "sync_alone": []}
    actions = {"step_sync": lambda: step(True),
               "step_nosync": lambda: step(False),
               "sync_alone": sync_alone}
    # The modes take turns so that load from elsewhere falls on all alike.
    for _ in range(args.rounds):
        for name, action in actions.items():
            for _ in range(args.steps):
                dist.barrier()
                start = time.perf_counter()
                action()
                samples[name].append(time.perf_counter() - start)
    dist.barrier()
    if rank == 0:
        results = {name: statistics.median(v) for name, v in samples.items()}
        results["optimizer"] = statistics.median(optimizer_seconds)
        results["buckets"] = len(bucket_buffers)
        queue.put(results)
    # Every rank is past the barrier and the results are in the pipe. Leave
    # without destroy_process_group and interpreter shutdown: in torch 1.13, a
    # rank whose TCPStore host (rank 0) exited first can spin forever in the
    # store client's thread (poll and a 0-byte recv on the closed socket,
    # seen here at 2 ranks with the conv net), and the baseline never ends.
    os._exit(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--gradient_as_bucket_view", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(torch_ranks.run(worker, args)))


if __name__ == "__main__":
    main()
