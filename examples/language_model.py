"""A small character-level GPT trained by ct.run on text that ships with scikit-learn.

No download: the text is the dataset descriptions inside the scikit-learn package
(sklearn/datasets/descr/*.rst, about 43,000 characters). Training samples are
windows of varying length (a quarter to all of the context), padded to the context
length; padded positions carry the label -100 and count for nothing. The loss is the
mean over real tokens, so micro-batches are weighted by their real tokens,
``accumulate(n, weight=real_tokens)``: the update is exactly the one of the whole batch
(PITFALLS 1), however the padding falls. Attention heads are split with einops; each block's
activations are recomputed in backward (``checkpoint_activations``) instead of kept.

    python examples/language_model.py                          # alone
    torchrun --nproc-per-node=2 examples/language_model.py     # two processes, DDP

It prints a sample of generated text at the end.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

import sklearn.datasets
import torch
import torch.nn.functional as F
from cli import at_least  # examples/cli.py, beside this script
from einops import rearrange
from torch import nn
from torch.utils.data import Dataset

import composetrain as ct

HEADS = 4  # attention heads per block
IGNORE = -100  # cross_entropy's ignore_index: padded positions


def corpus() -> str:
    """The dataset descriptions that ship inside scikit-learn, one after another."""
    folder = Path(sklearn.datasets.__file__).parent / "descr"
    return "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.rst")))


class Windows(Dataset):
    """Windows of ``text`` (as token ids) of varying length, right-padded to ``context`` tokens.

    Each item is ``(inputs, labels)``: labels are the inputs shifted by one, and
    ``IGNORE`` where the window is padded.
    """

    def __init__(self, ids: torch.Tensor, context: int, count: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids, self.context = ids, context
        self.starts = torch.randint(0, len(ids) - context - 1, (count,), generator=g)
        self.lengths = torch.randint(context // 4, context + 1, (count,), generator=g)

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start, length = int(self.starts[i]), int(self.lengths[i])
        chunk = self.ids[start : start + length + 1]
        inputs = torch.zeros(self.context, dtype=torch.long)
        labels = torch.full((self.context,), IGNORE, dtype=torch.long)
        inputs[:length], labels[:length] = chunk[:-1], chunk[1:]
        return inputs, labels


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: Any = None) -> torch.Tensor:
        q, k, v = rearrange(self.qkv(self.norm1(x)), "b t (three h d) -> three b h t d", three=3, h=self.heads)
        x = x + self.out(rearrange(attend(q, k, v, mask), "b h t d -> b t (h d)"))
        return x + self.mlp(self.norm2(x))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any) -> torch.Tensor:
    """Causal attention (right padding: real tokens never attend to the padding after them), or, for packed rows,
    attention inside each document: a boolean mask (``ct.document_mask``) or a flex_attention ``BlockMask``
    (``ct.document_block_mask``)."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    from torch.nn.attention.flex_attention import flex_attention

    return flex_attention(q, k, v, block_mask=mask)


class GPT(nn.Module):
    def __init__(self, vocab: int, context: int, width: int = 128, depth: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor, position_ids: torch.Tensor | None = None, mask: Any = None) -> torch.Tensor:
        """Logits for ``ids``; packed rows (``ct.pack``) give their ``position_ids`` and a mask that keeps attention
        inside each document (``ct.document_mask(document_ids)``), else positions count from 0, causally."""
        positions = torch.arange(ids.shape[1], device=ids.device) if position_ids is None else position_ids
        x = self.tokens(ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, count: int, temperature: float = 0.8, seed: int = 0) -> torch.Tensor:
        g = torch.Generator(device=ids.device).manual_seed(seed)
        for _ in range(count):
            logits = self(ids[:, -self.context :])[:, -1] / temperature
            ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1, generator=g)], dim=1)
        return ids


def real_tokens(batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """The units the loss averages over: positions with a label."""
    return (batch[1] != IGNORE).sum()


def step(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, labels = batch
    logits = model(inputs)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)  # mean over real tokens


def evaluate(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"loss": step(model, batch)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=at_least(1), default=4)
    parser.add_argument("--samples", type=at_least(1), default=4096, help="training windows per epoch")
    parser.add_argument("--batch-size", type=at_least(1), default=64, help="windows per update, per process")
    parser.add_argument("--accumulate", type=at_least(1), default=4)
    parser.add_argument("--context", type=at_least(4), default=64, help="tokens per window (at least 4)")
    parser.add_argument("--width", type=at_least(HEADS), default=128, help=f"a multiple of the {HEADS} heads")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--run-dir", default=None, help="checkpoint here (rerun to resume)")
    parser.add_argument("--sample-length", type=at_least(0), default=300)
    args = parser.parse_args(argv)
    if args.width % HEADS:
        parser.error(f"--width {args.width} must be a multiple of the {HEADS} attention heads, e.g. {HEADS * 32}")

    text = corpus()
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    cut = int(0.9 * len(ids))
    if args.context > len(ids) - cut - 2:  # the held-out text must hold a window and its next token
        parser.error(f"--context {args.context} is longer than the held-out text allows ({len(ids) - cut - 2})")
    train = Windows(ids[:cut], args.context, args.samples, seed=0)
    held_out = Windows(ids[cut:], args.context, 256, seed=1)

    torch.manual_seed(0)
    model = GPT(len(chars), args.context, width=args.width, heads=HEADS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    updates = args.epochs * math.ceil(args.samples / (args.batch_size * int(os.environ.get("WORLD_SIZE", "1"))))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=updates, pct_start=0.1)
    state = ct.TrainState(model, optimizer, schedule)

    train_step = ct.compose(
        ct.distributed,
        ct.clip_grad_norm(1.0),
        ct.mixed_precision(dtype=args.precision),
        ct.checkpoint_activations(Block),  # recompute each block's activations in backward: less memory
        ct.accumulate(args.accumulate, weight=real_tokens),
    )(step)
    result = ct.run(
        train_step,
        state,
        train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        eval_step=evaluate,
        eval_data=held_out,
        log_every=10,
        checkpoint_dir=args.run_dir,
    )

    if int(os.environ.get("RANK", "0")) == 0:
        for record in result.evals:
            print(f"epoch {record['epoch']}  step {record['step']:4d}  held-out loss {record['loss']:.3f}")
        prompt = torch.tensor([[chars.index(c) for c in "The data"]], device=next(model.parameters()).device)
        model.eval()
        sample = model.generate(prompt, args.sample_length)[0].tolist()
        print(f"{train_step}: final train loss {result.history[-1]['loss']:.3f}")
        print("sample:\n" + "".join(chars[i] for i in sample))


if __name__ == "__main__":
    main()
