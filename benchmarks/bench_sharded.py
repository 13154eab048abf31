"""ct.sharded (FSDP2) against ct.distributed (DDP) on the same model: throughput and per-rank memory.

    torchrun --nproc-per-node=2 benchmarks/bench_sharded.py                      # CPU, gloo
    torchrun --nproc-per-node=8 benchmarks/bench_sharded.py --device cuda --width 4096 --depth 8  # GPUs, nccl
    torchrun --nproc-per-node=2 benchmarks/bench_sharded.py --only sharded       # peak memory of one contender

Both ranks run the same contenders in the same order (they share collectives); rank 0
prints the table. Contenders: distributed(accumulate(n)), sharded(accumulate(n)) with each
Linear a unit (gradients reduce-scattered once per update) and the same with
sync_every_micro_batch=True. Memory: this rank's bytes of parameters, gradients (at the
update) and AdamW state, counted from the tensors; with ``--only`` also the peak resident
memory of the process (CPU) or the peak allocated CUDA memory.
"""

from __future__ import annotations

import argparse
import resource

import torch
from bench_accumulate import make_model, step
from common import compare, report, timed_loop
from torch import nn

import composetrain as ct

CONTENDERS = {
    "distributed(accumulate)": lambda n: ct.distributed(ct.accumulate(n)(step)),
    "sharded(accumulate)": lambda n: ct.sharded(ct.accumulate(n)(step), modules=nn.Linear),
    "sharded(accumulate), sync every micro-batch": lambda n: ct.sharded(
        ct.accumulate(n)(step), modules=nn.Linear, sync_every_micro_batch=True
    ),
}


def local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


class _Count(ct.TrainStep):
    """Counts this rank's gradient bytes in the update phase (then updates as usual)."""

    seen: dict[str, int] = {}  # noqa: RUF012 (a benchmark's scratch space)

    def update(self, state, ctx):
        _Count.seen["grads"] = sum(local_bytes(p.grad) for p in state.model.parameters() if p.grad is not None)
        return self._inner().update(state, ctx)


def memory(name: str, n: int, model: nn.Module, batch, device: torch.device) -> dict[str, float]:
    state = ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    build = {
        "distributed(accumulate)": lambda s: ct.distributed(s),
        "sharded(accumulate)": lambda s: ct.sharded(s, modules=nn.Linear),
        "sharded(accumulate), sync every micro-batch": lambda s: ct.sharded(
            s, modules=nn.Linear, sync_every_micro_batch=True
        ),
    }[name]
    train = build(ct.accumulate(n)(_Count(ct.train_step(step))))
    for _ in range(3):
        train(state, batch)
    mib = 2**20
    found = {
        "params MiB": sum(local_bytes(p) for p in state.model.parameters()) / mib,
        "grads MiB": _Count.seen["grads"] / mib,
        "optimizer MiB": sum(local_bytes(v) for e in state.optimizer.state.values() for v in e.values()) / mib,
    }
    if device.type == "cuda":
        found["peak allocated MiB"] = torch.cuda.max_memory_allocated() / mib
    else:
        found["peak resident MiB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128, help="per rank")
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", choices=sorted(CONTENDERS), default=None, help="memory of one contender")
    args = parser.parse_args()

    if args.device == "cpu":
        torch.set_num_threads(1)  # two ranks on two cores
    with ct.rendezvous() as proc:
        torch.manual_seed(proc.rank)  # each rank its own data
        device = proc.device
        batches = [
            (torch.randn(args.batch, 256, device=device), torch.randint(0, 10, (args.batch,), device=device))
            for _ in range(4)
        ]
        if args.only is not None:
            found = memory(args.only, args.n, make_model(args.width, args.depth).to(device), batches[0], device)
            if proc.is_main:
                print(
                    f"{args.only}, rank 0 of {proc.world_size}: " + ", ".join(f"{k} {v:.1f}" for k, v in found.items())
                )
            return
        contenders = {}
        states = []
        for name, build in CONTENDERS.items():
            model = make_model(args.width, args.depth).to(device)
            state = ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
            states.append(state)
            train = build(args.n)
            contenders[name] = timed_loop(
                lambda i, train=train, state=state: train(state, batches[i % len(batches)]), device.type
            )
        results = compare(contenders, updates=args.updates, rounds=args.rounds)
        if proc.is_main:
            title = (
                f"sharded vs distributed, accumulate({args.n}): {proc.world_size} ranks over {proc.backend}, MLP "
                f"256-{args.width}x{args.depth}-10, AdamW, batch {args.batch} per rank"
            )
            print(report(title, results, "distributed(accumulate)"))
        for state in states:
            state.release_runtime()


if __name__ == "__main__":
    main()
