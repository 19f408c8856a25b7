"""Baseline for //tools/bench:sharding: torch's ZeroRedundancyOptimizer (ZeRO
stage 1) against DDP over Gloo (Debian's python3-torch; its FSDP needs CUDA).

Run by the C++ benchmark as `/usr/bin/python3 torch_zero.py --world_size=2
--model=mlp --mode=zero1`; rank 0 prints one JSON object as its last line:
  step_s       median seconds of one step (forward, backward, DDP's gradient
               allreduce, AdamW, zero_grad), the same models and batch as
               sharding.cc
  state_bytes  the largest rank's model state after a step: the bytes of its
               parameters, gradients and optimizer state tensors (counted over
               the tensors: Python has no CPU allocator counter to install)
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
from torch.distributed.optim import ZeroRedundancyOptimizer

import torch_ranks

BATCH = 8


class MeanHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(256, 16)

    def forward(self, x):
        return self.linear(x.mean(0))


def build(model_name, transformer_layers):
    """The models and batches of tools/bench/sharding.cc."""
    torch.manual_seed(0)
    if model_name == "mlp":
        layers = []
        for _ in range(24):
            layers += [nn.Linear(1024, 1024), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(1024, 16))
        inputs = torch.randn(BATCH, 1024)
    elif model_name == "transformer":
        model = nn.Sequential(*[
            nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024,
                                       dropout=0.0) for _ in range(transformer_layers)],
            MeanHead())
        inputs = torch.randn(32, BATCH, 256)
    else:
        raise SystemExit(
            f"--model: expected mlp or transformer, found {model_name}")
    return model, inputs, torch.randint(0, 16, (BATCH,))


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors
               if torch.is_tensor(t))


def worker(rank, args, port, queue):
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
        world_size=args.world_size)
    model, inputs, labels = build(args.model, args.transformer_layers)
    ddp = nn.parallel.DistributedDataParallel(model)
    if args.mode == "zero1":
        optimizer = ZeroRedundancyOptimizer(
            ddp.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-4)
        state_of = optimizer.optim.state
    else:
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
        state_of = optimizer.state

    def step():
        F.cross_entropy(ddp(inputs), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)

    for _ in range(args.warmup):
        step()
    seconds = []
    for _ in range(args.steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    params = list(model.parameters())
    held = (tensor_bytes(params) +
            tensor_bytes([p.grad for p in params if p.grad is not None]) +
            sum(tensor_bytes(s.values()) for s in state_of.values()))
    largest = torch.tensor([float(held)], dtype=torch.float64)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    step_s = torch.tensor([statistics.median(seconds)], dtype=torch.float64)
    dist.all_reduce(step_s, op=dist.ReduceOp.MAX)
    dist.barrier()
    if rank == 0:
        queue.put({"step_s": step_s.item(), "state_bytes": largest.item()})
    # As torch_ddp.py: leave without destroy_process_group (torch 1.13's
    # store client can spin after rank 0's store is gone).
    os._exit(0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world_size", type=int, default=2)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--transformer_layers", type=int, default=24)
    parser.add_argument("--mode", choices=["ddp", "zero1"], default="zero1")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    print(json.dumps(torch_ranks.run(worker, args)))


if __name__ == "__main__":
    main()
