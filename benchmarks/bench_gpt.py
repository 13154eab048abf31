"""The transform stack's overhead on a small GPT, against the hand-written loop it replaces.

A nanoGPT-sized decoder (written here: token and position embeddings, pre-LayerNorm
blocks of causal self-attention and a GELU MLP, a tied head) trained on a fixed,
seeded random corpus with AdamW, gradient clipping and accumulation. Three
contenders, fed the same micro-batches, run interleaved:

(a) the hand-written loop: per micro-batch ``(ce / accum).backward()`` (under
    autocast for bf16), then ``clip_grad_norm_``, ``opt.step()``, ``zero_grad``;
(b) the composetrain stack called directly:
    ``clip_grad_norm(1.0)(mixed_precision(accumulate(4)(step)))``;
(c) ``ct.run`` over a TensorDataset of the same windows; one call per round, so its
    time includes what each call starts (the loader, its workers): raise --updates to
    amortise it.

Before timing, (a) and (b) train a few updates from the same weights and must agree
to float32 rounding, so the two time the same work.

    python benchmarks/bench_gpt.py                       # fp32 and bf16, 21 rounds
    python benchmarks/bench_gpt.py --dtype bf16 --rounds 31 --updates 10
    python benchmarks/bench_gpt.py --device cuda
    python benchmarks/bench_gpt.py --dtype fp32 --control --rounds 41   # against the loop again: the noise floor
    python benchmarks/bench_gpt.py --threads 1 --clock cpu --control     # CPU time: a shared machine's waits left out
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import time

import torch
import torch.nn.functional as F
from common import compare, report, timed_loop
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        # (b, t, c) -> (b, heads, t, c // heads)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, width: int, depth: int, heads: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied: the head reads logits off the embedding
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                nn.init.normal_(
                    p, std=0.02 / (math.sqrt(2 * depth) if name.endswith(("proj.weight", "down.weight")) else 1)
                )
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def step(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)


def windows(corpus: torch.Tensor, count: int, context: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` random (input, next-token target) windows of the corpus."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(corpus) - context - 1, (count,), generator=g)
    x = torch.stack([corpus[s : s + context] for s in starts.tolist()])
    y = torch.stack([corpus[s + 1 : s + context + 1] for s in starts.tolist()])
    return x, y


def hand_written(model, batches, accum, dtype, device, clip):
    opt = adamw(model)
    autocast = (lambda: torch.autocast(device, dtype=dtype)) if dtype != torch.float32 else contextlib.nullcontext

    def one(i: int) -> torch.Tensor:
        x, y = batches[i % len(batches)]
        total = None
        for xb, yb in zip(x.tensor_split(accum), y.tensor_split(accum), strict=True):
            with autocast():
                logits = model(xb)
                ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1))
            loss = ce / accum
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    return one


def stack(accum, dtype, clip):
    """clip_grad_norm(clip)(accumulate(accum)(step)), with mixed_precision around accumulate for bf16."""
    inner = ct.accumulate(accum)(step)
    if dtype != torch.float32:
        inner = ct.mixed_precision(inner, dtype=dtype)
    return ct.clip_grad_norm(clip)(inner)


def composed(model, batches, accum, dtype, device, clip):
    state = ct.TrainState(model, adamw(model))
    train = stack(accum, dtype, clip)
    return lambda i: train(state, batches[i % len(batches)]).loss


def driver(model, dataset, batch_size, accum, dtype, device, clip, clock=time.perf_counter):
    state = ct.TrainState(model, adamw(model))
    train = stack(accum, dtype, clip)
    # on the CPU clock, the batches read in this process (a loader worker's time would not be counted)
    workers = {"num_workers": 0} if clock is time.process_time else {}

    def run(updates: int) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        start = clock()
        ct.run(train, state, dataset, batch_size=batch_size, max_steps=state.step + updates, progress=False, **workers)
        if device == "cuda":
            torch.cuda.synchronize()
        return clock() - start

    return run


def check_same_work(model, batches, args, dtype) -> None:
    """(a) and (b) from the same weights: same losses and weights after a few updates, to fp32 rounding."""
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    hand = hand_written(a, batches, args.accum, dtype, args.device, args.clip)
    ours = composed(b, batches, args.accum, dtype, args.device, args.clip)
    for i in range(3):
        la, lb = hand(i), ours(i)
        torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-6, msg=lambda m, i=i: f"loss of update {i}: {m}")
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pb, pa, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"parameter {n}: {m}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--accum", type=int, default=4)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--updates", type=int, default=10, help="optimizer updates timed per contender per round")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--dtype", choices=["fp32", "bf16", "both"], default="both")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    parser.add_argument("--no-run", action="store_true", help="leave out ct.run (the transform stack alone)")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="time by the wall clock, or by this process's CPU time (a shared machine's waits for a core left out; "
        "with --threads 1, and ct.run reading in this process)",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="add the hand-written loop again, on a copy of its own: its ratio to the first is the noise floor",
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.clock == "cpu" and args.device != "cpu":
        parser.error("--clock cpu times the CPU's work: use it with --device cpu")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter

    g = torch.Generator().manual_seed(0)
    corpus = torch.randint(0, args.vocab, (100_000,), generator=g)
    xs, ys = windows(corpus, 8 * args.batch, args.context, seed=1)
    xs, ys = xs.to(args.device), ys.to(args.device)
    batches = [(xs[i : i + args.batch], ys[i : i + args.batch]) for i in range(0, len(xs), args.batch)]
    torch.manual_seed(0)
    model = GPT(args.vocab, args.context, args.width, args.depth, args.heads).to(args.device)

    for name in ["fp32", "bf16"] if args.dtype == "both" else [args.dtype]:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        check_same_work(model, batches, args, dtype)
        contenders = {
            "hand-written loop": timed_loop(
                hand_written(copy.deepcopy(model), batches, args.accum, dtype, args.device, args.clip),
                args.device,
                clock,
            ),
            "composetrain stack": timed_loop(
                composed(copy.deepcopy(model), batches, args.accum, dtype, args.device, args.clip), args.device, clock
            ),
        }
        if args.control:  # the same loop and work: whatever its ratio is off 1 by, the machine made
            contenders["hand-written loop, again"] = timed_loop(
                hand_written(copy.deepcopy(model), batches, args.accum, dtype, args.device, args.clip),
                args.device,
                clock,
            )
        if not args.no_run:
            dataset = TensorDataset(xs.cpu(), ys.cpu())
            contenders["ct.run"] = driver(
                copy.deepcopy(model), dataset, args.batch, args.accum, dtype, args.device, args.clip, clock
            )
        results = compare(contenders, updates=args.updates, rounds=args.rounds)
        print(
            report(
                f"GPT {args.depth}x{args.width}, {args.heads} heads, context {args.context}, vocab {args.vocab}, "
                f"batch {args.batch} in {args.accum}, AdamW, clip {args.clip}, {name}, {args.device}, "
                f"{torch.get_num_threads()} threads, torch {torch.__version__}, {args.clock} clock",
                results,
                "hand-written loop",
            )
        )
        print(flush=True)


if __name__ == "__main__":
    main()
