"""Pretraining on token shards, as nanoGPT does, through ct.run: shards written once, windows or packed documents.

No download: the text is Python's own help topics (the standard library's ``pydoc_data``, about 460 kB), each
paragraph a document. It is written once, byte-level (ids 0-255, and 256 ending each document), as uint16 shards
with ``ct.write_tokens`` (atomic: a shard is there whole or not at all). Training then reads either

- plain windows (the default): ``ct.tokens`` maps the shards and serves windows of ``--seq-len + 1`` tokens, read a
  whole batch at a time, every window once per epoch in ct.run's global order; or
- packed documents (``--pack``): the documents are cut out of the shards at their end token and packed once by
  ``ct.pack`` into rows of ``--seq-len``; the GPT gets their position ids and the block-causal mask
  (``ct.document_mask``), so no token attends to or predicts another document's, and micro-batches are weighted by
  their labelled tokens (``accumulate(n, weight=labelled)``).

The GPT is the einops one of ``examples/language_model.py``. ``global_batch_size`` defines the run by its global
batch, so rerunning resumes from the checkpoint in ``--run-dir`` on any number of processes dividing it.

    python examples/pretrain_tokens.py                          # windows
    python examples/pretrain_tokens.py --pack --run-dir runs/packed
    torchrun --nproc-per-node=2 examples/pretrain_tokens.py     # two processes, DDP

It prints a sample of generated text at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from cli import at_least  # examples/cli.py, beside this script
from language_model import GPT, HEADS  # the einops GPT, beside this script

import composetrain as ct

END = 256  # the token that ends each document: bytes are 0-255
VOCAB = END + 1
SHARDS = 2  # training shards; one more holds the held-out documents


def documents() -> list[bytes]:
    """Python's help topics (they ship with the standard library), each paragraph a document."""
    from pydoc_data.topics import topics

    return [p.strip().encode() for name in sorted(topics) for p in topics[name].split("\n\n") if p.strip()]


def prepare(folder: Path) -> list[Path]:
    """The shards in ``folder``: written once, in a folder of their own renamed into place, so that two processes
    starting together (torchrun) never append to one shard twice; the loser's copy is thrown away."""
    names = [f"train_{n:03d}.bin" for n in range(SHARDS)] + ["val_000.bin"]
    if not folder.exists():
        docs = [[*d, END] for d in documents()]  # bytes iterate as ints 0-255
        parts = [[d for i, d in enumerate(docs) if i % 20 and i % SHARDS == n] for n in range(SHARDS)]
        parts.append([d for i, d in enumerate(docs) if not i % 20])  # every 20th document is held out
        scratch = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
        scratch.mkdir(parents=True)
        for name, part in zip(names, parts, strict=True):
            ct.write_tokens(part, scratch / name, dtype=np.uint16)
        try:
            scratch.rename(folder)
        except OSError:  # another process published them first: the same bytes
            shutil.rmtree(scratch)
    return [folder / name for name in names]


def split_documents(path: Path) -> list[np.ndarray]:
    """The documents of a shard: its tokens cut after each END."""
    ids = np.fromfile(path, np.uint16)
    ends = np.flatnonzero(ids == END) + 1
    return [d for d in np.split(ids, ends) if len(d)]


def window_step(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())


def packed_step(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    mask = ct.document_mask(batch["document_ids"])  # attention inside each document only
    logits = model(batch["input_ids"], position_ids=batch["position_ids"], mask=mask)
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())  # -100 is ignored: the labelled mean


def labelled(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The units a packed micro-batch's mean loss averages over: its labelled positions."""
    return (batch["labels"] != -100).sum()


def evaluate(step: Any) -> Any:
    def loss(model: torch.nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        return {"loss": step(model, batch)}

    return loss


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", default="runs/pretrain_tokens", help="shards and checkpoints (rerun to resume)")
    parser.add_argument("--pack", action="store_true", help="packed documents instead of windows")
    parser.add_argument("--seq-len", type=at_least(8), default=128, help="tokens per window or packed row")
    parser.add_argument("--batch-size", type=at_least(1), default=32, help="windows (rows) per update, all processes")
    parser.add_argument("--accumulate", type=at_least(1), default=2)
    parser.add_argument("--epochs", type=at_least(1), default=2)
    parser.add_argument("--max-steps", type=at_least(1), default=None, help="stop after this many updates in all")
    parser.add_argument("--width", type=at_least(HEADS), default=128, help=f"a multiple of the {HEADS} heads")
    parser.add_argument("--eval-every", type=at_least(1), default=25, help="updates between held-out evaluations")
    parser.add_argument("--sample-length", type=at_least(0), default=200)
    args = parser.parse_args(argv)
    if args.width % HEADS:
        parser.error(f"--width {args.width} must be a multiple of the {HEADS} attention heads, e.g. {HEADS * 32}")

    run_dir = Path(args.run_dir)
    *train_files, val_file = prepare(run_dir / "data")
    if args.pack:  # documents packed once; the same documents give the same rows in every process and run
        train = ct.pack([d for f in train_files for d in split_documents(f)], args.seq_len, split=True)
        held_out = ct.pack(split_documents(val_file), args.seq_len, split=True)
        step, weight = packed_step, labelled
        padded = 1 - train.tokens / (train.pieces.shape[0] * args.seq_len)  # one piece per row, padded
        what = f"{train}; padded rows would be {padded:.1%} padding"
    else:  # every window once per epoch; vocab_size checks every token of the shards once, here
        train = ct.tokens(train_files, args.seq_len, dtype=np.uint16, vocab_size=VOCAB)
        held_out = ct.tokens(val_file, args.seq_len, dtype=np.uint16, vocab_size=VOCAB)
        step, weight = window_step, None
        what = f"{train}, the last {sum(train.dropped)} tokens of the shards' tails unread"

    torch.manual_seed(0)
    model = GPT(VOCAB, args.seq_len, width=args.width, heads=HEADS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, ct.warmup(20))
    state = ct.TrainState(model, optimizer, schedule)
    train_step = ct.compose(ct.distributed, ct.clip_grad_norm(1.0), ct.accumulate(args.accumulate, weight=weight))(step)
    main_process = int(os.environ.get("RANK", "0")) == 0
    if main_process:
        print(what)
        if any((run_dir / "checkpoints").glob("step-*")):
            print(f"resuming from the checkpoint in {run_dir / 'checkpoints'}")
    result = ct.run(
        train_step,
        state,
        train,
        global_batch_size=args.batch_size,
        epochs=args.epochs,
        max_steps=args.max_steps,
        eval_step=evaluate(step),
        eval_data=held_out,
        eval_every=args.eval_every,
        log_every=10,
        checkpoint_dir=run_dir / "checkpoints",
        checkpoint_every=25,
    )

    if main_process:
        for record in result.evals:
            print(f"epoch {record['epoch']}  step {record['step']:4d}  held-out loss {record['loss']:.3f}")
        print(f"{train_step}: step {result.steps}, final train loss {result.history[-1]['loss']:.3f}")
        prompt = torch.tensor([list(b"The ")], device=next(model.parameters()).device)
        model.eval()
        sample = model.generate(prompt, args.sample_length)[0].tolist()
        print("sample:\n" + bytes(t for t in sample if t < END).decode(errors="replace"))


if __name__ == "__main__":
    main()
