"""Starts a torch.distributed job of `world_size` ranks on this host for the
Python baselines (torch_ddp.py, torch_zero.py) and returns what rank 0 put
in the queue:

    results = torch_ranks.run(worker, args)   # worker(rank, args, port, queue)
"""
import socket

import torch.multiprocessing as mp


def run(worker, args):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(worker, args=(args, port, queue),
                       nprocs=args.world_size, join=True, start_method="spawn")
    return queue.get()
