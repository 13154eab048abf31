"""ct.compile on a small GPT: eager against compiled, hand-written loop against composition; warm restarts.

Part 1, speed. The GPT of bench_gpt.py (fp32 by default), AdamW, clipping and accumulation, four contenders fed
the same micro-batches, run interleaved (medians of per-round ratios to the hand-written eager loop):

(a) hand-written eager loop: per micro-batch ``(ce / accum).backward()``, ``clip_grad_norm_``, ``opt.step()``;
(b) the same loop with the forward and loss compiled by hand: ``torch.compile(step)`` called in place of step;
(c) composetrain eager: ``clip_grad_norm(1.0)(accumulate(accum)(step))``;
(d) composetrain compiled: ``compile(clip_grad_norm(1.0)(accumulate(accum)(step)))``.

Before timing, (a) and (c) must agree to float32 rounding, and so must (b) and (d), so each pair times the same
work. The issue's bar: (d) at least 0.98 of (b).

Part 2, warm restarts (``--restarts N``, 0 to skip): a job runs one update under ``ct.run`` with a checkpoint_dir
and exits; it is then resumed, in a fresh process with empty local compile caches (as on another node, or after
/tmp was cleared), once with the compile caches ct.run kept beside the checkpoints, once without them (the
folder removed), and once with neither but the first run's local caches (what a restart on the same machine
with torch's default /tmp caches gets). Each resumed process reports the seconds from calling ct.run to the end
of its first update (model built, checkpoint loaded, compiled, one update). Medians over N interleaved restarts.

    python benchmarks/bench_compile.py                         # CPU, fp32, 7 rounds, 3 restarts
    python benchmarks/bench_compile.py --device cuda --rounds 21 --updates 20
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_gpt import GPT, adamw, step, windows
from common import compare, report, timed_loop
from torch.utils.data import TensorDataset

import composetrain as ct


def hand_written(model, batches, accum, clip, forward):
    opt = adamw(model)

    def one(i: int) -> torch.Tensor:
        x, y = batches[i % len(batches)]
        total = None
        for xb, yb in zip(x.tensor_split(accum), y.tensor_split(accum), strict=True):
            loss = forward(model, (xb, yb)) / accum
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    return one


def composed(model, batches, accum, clip, compiled):
    state = ct.TrainState(model, adamw(model))
    train = ct.clip_grad_norm(clip)(ct.accumulate(accum)(step))
    train = ct.compile(train) if compiled else train
    return lambda i: train(state, batches[i % len(batches)]).loss


def same_work(a, b, what: str) -> None:
    for i in range(3):
        torch.testing.assert_close(b(i), a(i), rtol=1e-4, atol=1e-5, msg=lambda m, i=i: f"{what}, update {i}: {m}")


def speed(args, model, batches) -> None:
    def fresh(kind: str):
        m = copy.deepcopy(model)
        return {
            "hand-written eager": lambda: hand_written(m, batches, args.accum, args.clip, step),
            "hand-written compiled": lambda: hand_written(m, batches, args.accum, args.clip, torch.compile(step)),
            "composetrain eager": lambda: composed(m, batches, args.accum, args.clip, False),
            "composetrain compiled": lambda: composed(m, batches, args.accum, args.clip, True),
        }[kind]()

    same_work(fresh("hand-written eager"), fresh("composetrain eager"), "eager")
    same_work(fresh("hand-written compiled"), fresh("composetrain compiled"), "compiled")
    names = ["hand-written eager", "hand-written compiled", "composetrain eager", "composetrain compiled"]
    contenders = {n: timed_loop(fresh(n), args.device) for n in names}
    results = compare(contenders, updates=args.updates, rounds=args.rounds)
    title = (
        f"GPT {args.depth}x{args.width}, {args.heads} heads, context {args.context}, vocab {args.vocab}, batch "
        f"{args.batch} in {args.accum}, AdamW, clip {args.clip}, fp32, {args.device}, {torch.get_num_threads()} "
        f"threads, torch {torch.__version__}"
    )
    print(report(title, results, "hand-written eager"))
    by = {r.name: r.rates for r in results}
    ratios = sorted(a / b for a, b in zip(by["composetrain compiled"], by["hand-written compiled"], strict=True))
    print(f"\ncomposetrain compiled / hand-written compiled: median {statistics.median(ratios):.3f} (bar: 0.98)\n")


def first_update(args) -> None:
    """In a fresh process: resume (or start) from args.job and time ct.run to the end of its next update."""
    model, batches = build(args)
    x = torch.cat([b[0] for b in batches]).cpu()
    y = torch.cat([b[1] for b in batches]).cpu()
    state = ct.TrainState(model, adamw(model))
    train = ct.compile(ct.clip_grad_norm(args.clip)(ct.accumulate(args.accum)(step)))
    done = 0
    for found in Path(args.job).glob("step-*"):
        done = max(done, int(found.name.split("-")[1]))
    started = time.perf_counter()
    result = ct.run(
        train,
        state,
        TensorDataset(x, y),
        batch_size=args.batch,
        max_steps=done + 1,
        checkpoint_dir=args.job,
        progress=False,
        num_workers=0,
        log_every=1,
    )
    if args.device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - started
    print(json.dumps({"seconds": seconds, "compile_s": result.history[-1].get("compile_s")}))


def restarts(args) -> None:
    def child(job: Path, caches: Path) -> dict[str, float]:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches), "TRITON_CACHE_DIR": str(caches / "triton")}
        cmd = [sys.executable, __file__, "--first-update", str(job), *sys.argv[1:]]
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    times: dict[str, list[float]] = {
        "first run": [],
        "restart, warm cache": [],
        "restart, no cache": [],
        "restart, same machine's local caches": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(args.restarts):
            job = root / f"job{i}"
            local = root / f"local{i}"  # the first run's local caches, reused by the last restart
            times["first run"].append(child(job, local)["seconds"])
            cold, again = root / f"cold{i}", root / f"again{i}"
            shutil.copytree(job, cold)
            shutil.copytree(job, again)
            shutil.rmtree(cold / "compile_cache")
            order = [("restart, warm cache", job, root / f"w{i}"), ("restart, no cache", cold, root / f"n{i}")]
            for name, folder, caches in order if i % 2 == 0 else order[::-1]:  # interleaved
                times[name].append(child(folder, caches)["seconds"])
            times["restart, same machine's local caches"].append(child(again, local)["seconds"])
    print(f"## Time to the first update, {args.restarts} restart(s) each (fresh process, empty local caches)\n")
    print("| job | seconds (median) | all |\n|---|---:|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.1f} | {', '.join(f'{v:.1f}' for v in values)} |")


def build(args):
    g = torch.Generator().manual_seed(0)
    corpus = torch.randint(0, args.vocab, (100_000,), generator=g)
    xs, ys = windows(corpus, 8 * args.batch, args.context, seed=1)
    xs, ys = xs.to(args.device), ys.to(args.device)
    batches = [(xs[i : i + args.batch], ys[i : i + args.batch]) for i in range(0, len(xs), args.batch)]
    torch.manual_seed(0)
    return GPT(args.vocab, args.context, args.width, args.depth, args.heads).to(args.device), batches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--updates", type=int, default=5, help="optimizer updates timed per contender per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--restarts", type=int, default=3, help="warm and cold restarts timed (0: skip part 2)")
    parser.add_argument("--no-speed", action="store_true", help="skip part 1")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    parser.add_argument("--first-update", default=None, help=argparse.SUPPRESS)  # part 2's child process
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.first_update is not None:
        args.job = args.first_update
        first_update(args)
        return
    if not args.no_speed:
        model, batches = build(args)
        speed(args, model, batches)
    if args.restarts:
        restarts(args)


if __name__ == "__main__":
    main()
