"""Parameter, gradient and optimizer bytes per rank of DDP, FSDP, HSDP 2x2, TP 2 x FSDP 2 and PP 2 x DP 2.

    torchrun --nproc-per-node=4 benchmarks/bench_meshes.py                                  # CPU, gloo
    torchrun --nproc-per-node=4 benchmarks/bench_meshes.py --device cuda --width 2048 --depth 8   # 4 GPUs, nccl
    python benchmarks/bench_meshes.py --device cuda --launch    # nox -s gpu: torchrun on 4 GPUs, or skipped with fewer

Every rank runs the same contenders in the same order (they share collectives); rank 0 prints the table. The model
is the example GPT's shape (pre-norm blocks of causal attention and an MLP, token and position embeddings, the
output layer tied to the token embedding), written as a chain of its parts so that ``ct.pipeline`` can split it,
with q, k and v separate so that a column split keeps whole heads. Memory is counted from the tensors each rank
holds (a DTensor's local shard, a stage's own parameters; gradients seen in the update phase; AdamW's moments),
not computed from the sizes. The times are per update, median of the rounds, each contender's against DDP's in
the same round: on a shared 2-core CPU with 4 processes they are noise, listed for scale only.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import composetrain as ct


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(b, t, -1, w // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.out(a)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Embed(nn.Module):
    def __init__(self, vocab: int, width: int, context: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))


class Head(nn.Module):
    def __init__(self, embed: Embed, width: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.proj = nn.Linear(width, vocab, bias=False)
        self.proj.weight = embed.tokens.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def gpt(args: argparse.Namespace) -> nn.Sequential:
    torch.manual_seed(0)
    embed = Embed(args.vocab, args.width, args.context)
    blocks = [Block(args.width, args.heads) for _ in range(args.depth)]
    return nn.Sequential(embed, *blocks, Head(embed, args.width, args.vocab))


def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    ids, labels = batch
    return F.cross_entropy(model(ids).flatten(0, 1), labels.flatten())


def contenders(depth: int) -> dict[str, ct.TrainStep]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict = {f"*.{name}": ColwiseParallel() for name in ("q", "k", "v", "up")}
    plan |= {"*.out": RowwiseParallel(), "*.down": RowwiseParallel()}
    half = 1 + depth // 2
    stages = [[str(i) for i in range(half)], [str(i) for i in range(half, depth + 2)]]
    counted = _Counted(ct.train_step(step))
    return {
        "DDP 4": ct.distributed(counted),
        "FSDP 4": ct.sharded(counted, modules=Block),
        "HSDP 2x2": ct.sharded(counted, modules=Block, replicate=2),
        "TP 2 x FSDP 2": ct.sharded(ct.tensor_parallel(plan, size=2)(counted), modules=Block),
        "PP 2 x DP 2": ct.distributed(ct.pipeline(stages, microbatches=4)(counted)),
    }


def local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.numel() * local.element_size()


class _Counted(ct.TrainStep):
    """Counts this rank's gradient bytes in the update phase (then updates as usual)."""

    seen: dict[str, int] = {}  # noqa: RUF012 (a benchmark's scratch space)

    def update(self, state, ctx):
        held = {id(p): p for g in state.optimizer.param_groups for p in g["params"]}
        _Counted.seen["grads"] = sum(local_bytes(p.grad) for p in held.values() if p.grad is not None)
        return self._inner().update(state, ctx)


def measure(name: str, train: ct.TrainStep, args: argparse.Namespace, device: torch.device, rank: int, world: int):
    model = gpt(args).to(device)
    state = ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    shard, _ = train.capabilities.data_shard(rank, world)
    g = torch.Generator().manual_seed(shard)
    ids = torch.randint(0, args.vocab, (args.batch, args.context), generator=g).to(device)
    batch = (ids, ids.roll(-1, dims=1))
    times = []
    for i in range(args.updates + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        train(state, batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:  # the first builds the mesh, splits and shards
            times.append(time.perf_counter() - start)
    held = {id(p): p for g in state.optimizer.param_groups for p in g["params"]}
    found = {
        "params": sum(local_bytes(p) for p in {id(p): p for p in state.model.parameters()}.values()),
        "grads": _Counted.seen["grads"],
        "optimizer": sum(local_bytes(v) for p in held.values() for v in state.optimizer.state.get(p, {}).values()),
        "update_s": statistics.median(times),
    }
    if device.type == "cuda":
        found["peak"] = torch.cuda.max_memory_allocated()
    state.release_runtime()
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="per data shard")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--launch", action="store_true", help="start the 4 processes here (skipped with fewer GPUs)")
    args, _ = parser.parse_known_args()
    if args.launch:
        launch(args)
        return
    if args.device == "cpu":
        torch.set_num_threads(1)
    with ct.rendezvous() as proc:
        if proc.world_size != 4:
            raise SystemExit(
                f"bench_meshes: run it on 4 processes (torchrun --nproc-per-node=4), not {proc.world_size}"
            )
        rows = {}
        for name, train in contenders(args.depth).items():
            found = measure(name, train, args, proc.device, proc.rank, proc.world_size)
            rows[name] = _gathered(found)
        if proc.is_main:
            print(report(rows, args, proc))


def launch(args: argparse.Namespace) -> None:
    """torchrun on 4 processes of this script with the same arguments; on CUDA, only with 4 GPUs or more."""
    import subprocess
    import sys

    if args.device == "cuda" and torch.cuda.device_count() < 4:
        print(f"bench_meshes: skipped, it needs 4 GPUs and this machine has {torch.cuda.device_count()}")
        return
    given = [a for a in sys.argv[1:] if a != "--launch"]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4", __file__, *given]
    subprocess.run(command, check=True)


def _gathered(value: dict) -> list[dict]:
    """Every rank's figures, by rank."""
    import torch.distributed as dist

    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def report(rows: dict, args: argparse.Namespace, proc) -> str:
    mib = 2**20
    whole = sum(p.numel() for p in {id(p): p for p in gpt(args).parameters()}.values()) * 4
    title = (
        f"bytes per rank, {proc.world_size} ranks over {proc.backend}: GPT width {args.width}, depth {args.depth}, "
        f"vocab {args.vocab}, context {args.context} (tied embeddings; {whole / mib:.1f} MiB of float32 parameters), "
        f"AdamW, batch {args.batch} per data shard"
    )
    lines = [
        title,
        "",
        "| layout | params MiB | grads MiB | AdamW MiB | total MiB (max rank) | of DDP's | update s (median) |",
    ]
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    ddp = max(r["params"] + r["grads"] + r["optimizer"] for r in rows["DDP 4"])
    ddp_time = statistics.median(r["update_s"] for r in rows["DDP 4"])
    for name, ranks in rows.items():
        totals = [r["params"] + r["grads"] + r["optimizer"] for r in ranks]

        def span(key: str, ranks=ranks) -> str:
            values = sorted({round(r[key] / mib, 2) for r in ranks})
            return f"{values[0]:.2f}" if len(values) == 1 else f"{values[0]:.2f}-{values[-1]:.2f}"

        seconds = statistics.median(r["update_s"] for r in ranks)
        lines.append(
            f"| {name} | {span('params')} | {span('grads')} | {span('optimizer')} | {max(totals) / mib:.2f} | "
            f"{max(totals) / ddp:.2f} | {seconds:.3f} ({seconds / ddp_time:.2f}x) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
