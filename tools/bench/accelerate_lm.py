#!/usr/bin/python3
"""//examples:gpt's job in Python Accelerate: the baseline of //tools/bench:lm.

The same text (the State of the Union addresses as bytes, years divisible
by 10 held out, each address followed by a blank line), blocks (block i
starts at byte block_size * i), batch order (the permutation accel's
DataLoader draws: torch.randperm seeded with seed + epoch; the global batch
split across the processes, split_batches=True), model (examples/gpt_model.h
module for module, registered in the same order, so that torch.manual_seed
gives the same initial weights), AdamW, cosine schedule with linear warm-up,
and validation blocks (--eval_blocks spread evenly over the held-out text,
through gather_for_metrics). Prints what the example prints ("step N:
validation loss ...", "Trained N tokens in S s of training steps: R
tokens/s") and logs to <output_dir>/python_accelerate/metrics.jsonl in
accel's JSONL format, so tools/plot_metrics draws both runs.

  PEER_SRC=<accelerate-0.20.3/src> shared/peer/launch.sh 2 29600 \\
      tools/bench/accelerate_lm.py --data_dir=... --output_dir=py
"""

import argparse
import glob
import math
import os
import time

import torch
from accelerate import Accelerator

import peer_metrics


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x, mask):
        batch, length, width = x.shape
        head = width // self.heads
        q, k, v = (t.view(batch, length, self.heads, head).transpose(1, 2)
                   for t in self.qkv(x).split(width, 2))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(head)
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
        y = torch.matmul(torch.softmax(scores, -1), v)
        return self.proj(y.transpose(1, 2).contiguous().view(batch, length, width))


class Block(torch.nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads)
        self.ln2 = torch.nn.LayerNorm(width)
        self.fc = torch.nn.Linear(width, 4 * width)
        self.fc_proj = torch.nn.Linear(4 * width, width)

    def forward(self, x, mask):
        x = x + self.attention(self.ln1(x), mask)
        return x + self.fc_proj(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class Gpt(torch.nn.Module):
    def __init__(self, vocab, block_size, layers, heads, width):
        super().__init__()
        self.token_embedding = torch.nn.Embedding(vocab, width)
        self.position_embedding = torch.nn.Embedding(block_size, width)
        self.blocks = torch.nn.ModuleList(
            Block(width, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        with torch.no_grad():  # GPT-2's initialisation, as gpt_model.cc.
            for name, p in self.named_parameters():
                if "weight" in name and p.dim() == 2:
                    p.normal_(0.0, 0.02)
                elif "ln" not in name:
                    p.zero_()

    def forward(self, tokens, mask):
        positions = torch.arange(tokens.size(1))
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x, mask)
        return torch.nn.functional.linear(self.ln_f(x),
                                          self.token_embedding.weight)


def read_text(data_dir):
    train, validation = [], []
    for path in sorted(glob.glob(os.path.join(data_dir, "*.txt"))):
        name = os.path.basename(path)
        if not name[:1].isdigit():
            continue
        text = open(path, "rb").read() + b"\n\n"
        (validation if int(name[:4]) % 10 == 0 else train).append(text)
    as_tensor = lambda parts: torch.frombuffer(bytearray(b"".join(parts)),
                                               dtype=torch.uint8)
    return as_tensor(train), as_tensor(validation)


class Blocks(torch.utils.data.Dataset):
    def __init__(self, text, block_size, max_blocks=0):
        self.text, self.block_size = text, block_size
        self.available = (text.numel() - 1) // block_size
        self.count = (min(max_blocks, self.available) if max_blocks > 0
                      else self.available)

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        block = i if self.count == self.available else i * self.available // self.count
        start = block * self.block_size
        chunk = self.text[start:start + self.block_size + 1].long()
        return chunk[:-1], chunk[1:]


class AccelOrder(torch.utils.data.Sampler):
    """accel's DataLoader order: randperm seeded with seed + epoch."""

    def __init__(self, size, seed):
        self.size, self.seed, self.epoch = size, seed, 0

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1
        return iter(torch.randperm(self.size, generator=generator).tolist())

    def __len__(self):
        return self.size


def cosine_with_warmup(optimizer, warmup, total):
    def factor(step):
        if step < warmup:
            return step / max(1, warmup)
        progress = (step - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup_steps", type=int, default=20)
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--n_head", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=128)
    parser.add_argument("--eval_blocks", type=int, default=256)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    accelerator = Accelerator(split_batches=True, cpu=True)
    torch.manual_seed(args.seed)
    train_text, validation_text = read_text(args.data_dir)
    train = Blocks(train_text, args.block_size)
    validation = Blocks(validation_text, args.block_size, args.eval_blocks)
    train_loader = torch.utils.data.DataLoader(
        train, batch_size=args.batch_size, drop_last=True,
        sampler=AccelOrder(len(train), args.seed))
    validation_loader = torch.utils.data.DataLoader(
        validation, batch_size=args.batch_size)
    model = Gpt(256, args.block_size, args.n_layer, args.n_head, args.n_embd)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = cosine_with_warmup(
        optimizer, min(args.warmup_steps, args.max_steps), args.max_steps)
    model, optimizer, train_loader, validation_loader, scheduler = (
        accelerator.prepare(model, optimizer, train_loader, validation_loader,
                            scheduler))
    mask = torch.ones(args.block_size, args.block_size, dtype=torch.bool).tril()

    record = peer_metrics.recorder(accelerator, args.output_dir)

    step = 0
    seconds = 0.0
    model.train()
    while step < args.max_steps:
        start = time.perf_counter()
        for tokens, targets in train_loader:
            logits = model(tokens, mask)
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            record(step, {"loss": loss.item()})
            if step >= args.max_steps:
                break
        seconds += time.perf_counter() - start

    model.eval()
    losses = []
    for tokens, targets in validation_loader:
        with torch.no_grad():
            logits = model(tokens, mask)
            per_block = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                reduction="none").view(targets.size(0), -1).mean(1)
        losses.append(accelerator.gather_for_metrics(per_block))
    loss = torch.cat(losses).double().mean().item()
    record(step, {"val_loss": loss, "val_perplexity": math.exp(loss)})
    tokens = step * args.batch_size * args.block_size
    accelerator.print(f"step {step}: validation loss {loss:.4f}, perplexity "
                      f"{math.exp(loss):.3f}")
    accelerator.print(f"Trained {tokens} tokens in {seconds:.2f} s of training "
                      f"steps: {tokens / seconds:.1f} tokens/s")
    accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        # As accelerate_nlp.py: torch 1.13's gloo group sometimes aborts a
        # rank left to exit.
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
