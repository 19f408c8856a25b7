#!/usr/bin/python3
"""nlp_example's job in Python Accelerate: the baseline of //tools/bench:nlp.

The same tokens (nlp_example's <output_dir>/tokens.pt), model (a 2-layer
nn.TransformerEncoder of width 64, 4 heads, feed-forward 128, no dropout,
the mean over the tokens, a linear head), AdamW, linear warmup schedule,
global batch split across the processes (split_batches=True), shuffling
without the last short batch, and evaluation through gather_for_metrics.
Prints what nlp_example prints ("epoch N: {...}", "trained on ...") and
logs to <output_dir>/python_accelerate/metrics.jsonl in accel's JSONL format, so
tools/plot_metrics draws both runs.

  PEER_SRC=<accelerate-0.20.3/src> shared/peer/launch.sh 2 29600 \\
      tools/bench/accelerate_nlp.py --tokens=run/tokens.pt --output_dir=py
"""

import argparse
import time

import torch
from accelerate import Accelerator

import peer_metrics


class SpamClassifier(torch.nn.Module):
    def __init__(self, vocab_size, length, width, layers):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab_size, width, padding_idx=0)
        self.positions = torch.nn.Embedding(length, width)
        layer = torch.nn.TransformerEncoderLayer(
            width, 4, dim_feedforward=2 * width, dropout=0.0)
        self.encoder = torch.nn.TransformerEncoder(layer, layers)
        self.head = torch.nn.Linear(width, 2)

    def forward(self, tokens):
        padding = tokens.eq(0)
        positions = torch.arange(tokens.size(1), device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        x = self.encoder(x.transpose(0, 1)).transpose(0, 1)
        kept = (~padding).unsqueeze(-1).to(x.dtype)
        return self.head((x * kept).sum(1) / kept.sum(1))


def linear_schedule_with_warmup(optimizer, warmup, total):
    def factor(step):
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def metrics(predictions, references):
    correct = predictions.eq(references).sum().item()
    tp = ((predictions == 1) & (references == 1)).sum().item()
    fp = ((predictions == 1) & (references == 0)).sum().item()
    fn = ((predictions == 0) & (references == 1)).sum().item()
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0
    return correct / references.numel(), f1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--num_warmup_steps", type=int, default=30)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--d_model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    accelerator = Accelerator(split_batches=True, cpu=True)
    torch.manual_seed(args.seed)
    _, train_tokens, train_labels, test_tokens, test_labels = torch.load(
        args.tokens)
    train = torch.utils.data.TensorDataset(train_tokens, train_labels)
    test = torch.utils.data.TensorDataset(test_tokens, test_labels)
    generator = torch.Generator().manual_seed(args.seed)
    train_loader = torch.utils.data.DataLoader(
        train, batch_size=args.batch_size, shuffle=True, drop_last=True,
        generator=generator)
    test_loader = torch.utils.data.DataLoader(test, batch_size=args.batch_size)
    model = SpamClassifier(args.vocab_size, train_tokens.size(1), args.d_model,
                           args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    total_steps = len(train_loader) * args.epochs
    scheduler = linear_schedule_with_warmup(optimizer, args.num_warmup_steps,
                                            total_steps)
    model, optimizer, train_loader, test_loader, scheduler = (
        accelerator.prepare(model, optimizer, train_loader, test_loader,
                            scheduler))

    record = peer_metrics.recorder(accelerator, args.output_dir)

    step = 0
    train_seconds = 0.0
    trained = 0
    for epoch in range(args.epochs):
        model.train()
        start = time.perf_counter()
        samples = 0
        losses = []
        for tokens, labels in train_loader:
            loss = torch.nn.functional.cross_entropy(model(tokens), labels)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            samples += tokens.size(0)
            step += 1
            losses.append(loss.item())
            record(step, {"loss": losses[-1]})
        seconds = time.perf_counter() - start
        model.eval()
        predictions, references = [], []
        for tokens, labels in test_loader:
            with torch.no_grad():
                predicted = model(tokens).argmax(-1)
            predicted, labels = accelerator.gather_for_metrics(
                (predicted, labels))
            predictions.append(predicted)
            references.append(labels)
        accuracy, f1 = metrics(torch.cat(predictions), torch.cat(references))
        global_samples = samples * accelerator.num_processes
        train_seconds += seconds
        trained += global_samples
        record(step, {"train_loss": sum(losses) / len(losses),
                      "accuracy": accuracy, "f1": f1,
                      "samples_per_second": global_samples / seconds,
                      "epoch": epoch})
        accelerator.print(
            f"epoch {epoch}: {{'accuracy': {accuracy:.6f}, 'f1': {f1:.6f}, "
            f"'samples': {torch.cat(references).numel()}}}")
    accelerator.print(f"trained on {trained} samples in {train_seconds:.2f} s: "
                      f"{trained / train_seconds:.1f} samples/s")
    accelerator.wait_for_everyone()
    if torch.distributed.is_initialized():
        # Left to exit, torch 1.13's gloo group sometimes aborts a rank there
        # ("terminate called without an active exception"; seen once in 6
        # runs at 2 processes).
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
