"""Fine-tuning a transformers GPT-2 through HF Trainer and through composetrain, side by side.

The setup of issue 25: a tiny GPT-2 built from a config (n_layer=2, n_head=2, n_embd=64, vocab 100,
n_positions 32; dropout off, so that runs compare exactly), 64 right-padded SFT-style sequences of 4 to
32 real tokens with labels -100 on the padding, 4 updates of 16 sequences in micro-batches of 4, plain
SGD (lr 0.1, constant, no clipping, no weight decay), the sequences in order.

(1) Exactness: each contender's weights after the 4 updates against the textbook large-batch update (one
loss averaged over every real predicted token of the 16 sequences, ``labels[:, 1:] != -100``, then one
SGD step), as ``max |w - w_textbook| / max |w_textbook - w_start|``, in float32 and float64:
- HF Trainer, ``gradient_accumulation_steps=4``;
- composetrain, ``accumulate(4, weight=ct.shifted_tokens())``;
- composetrain with the unshifted count ``(labels != -100).sum()`` (the recipe that ignores the shift).
All three call the model with ``labels`` and use its own loss (computed in float32 by transformers).

(2) Speed: the same 4 updates in float32, interleaved rounds (``common.compare``), as the ratio of
composetrain's training loop (the composed step over a DataLoader of the batches) to Trainer's (timed
from its ``on_train_begin`` to its ``on_train_end`` callback: its set-up, building the Trainer, the
optimizer and the loader, is excluded).

    python benchmarks/bench_hf.py                 # exactness, then 21 rounds of timing
    OMP_NUM_THREADS=1 python benchmarks/bench_hf.py --rounds 41   # the figures in benchmarks/README.md
"""

from __future__ import annotations

import argparse
import copy
import logging
import tempfile
import time

import torch
import torch.nn.functional as F
from common import compare, report
from torch.utils.data import DataLoader, Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback
from transformers.utils import logging as hf_logging

import composetrain as ct

SEQUENCES, LENGTH, BATCH, MICRO, LR, PAD = 64, 32, 16, 4, 0.1, -100


class SFT(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(1, 100, (SEQUENCES, LENGTH), generator=g)
        real = torch.randint(4, LENGTH + 1, (SEQUENCES,), generator=g)
        self.mask = (torch.arange(LENGTH)[None] < real[:, None]).long()
        self.ids = ids * self.mask
        self.labels = self.ids.masked_fill(self.mask == 0, PAD)

    def __len__(self) -> int:
        return SEQUENCES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def model(dtype: torch.dtype) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=64,
        vocab_size=100,
        n_positions=32,
        use_cache=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config).to(dtype)


def batches(data: SFT) -> list[dict[str, torch.Tensor]]:
    return list(DataLoader(data, batch_size=BATCH))


def textbook(m: GPT2LMHeadModel, data: SFT) -> None:
    for batch in batches(data):
        m.zero_grad(set_to_none=True)
        logits = m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        targets = batch["labels"][:, 1:]
        total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD, reduction="sum")
        (total / (targets != PAD).sum()).backward()
        with torch.no_grad():
            for p in m.parameters():
                p -= LR * p.grad


def step(m, batch):
    return m(**batch).loss


def composetrain(m: GPT2LMHeadModel, data: SFT, weight=None) -> float:
    """The 4 updates through the composed step; returns the seconds the loop took."""
    train = ct.accumulate(BATCH // MICRO, weight=weight or ct.shifted_tokens())(step)
    state = ct.TrainState(m, torch.optim.SGD(m.parameters(), lr=LR))
    loader = DataLoader(data, batch_size=BATCH)
    start = time.perf_counter()
    for batch in loader:
        train(state, batch)
    return time.perf_counter() - start


class _Clock(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs):
        self.seconds = time.perf_counter() - self.start


def trainer(m: GPT2LMHeadModel, data: SFT, folder: str) -> float:
    """The 4 updates through HF Trainer; returns the seconds of its training loop, set-up excluded."""
    args = TrainingArguments(
        output_dir=folder,
        per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=BATCH // MICRO,
        max_steps=SEQUENCES // BATCH,
        learning_rate=LR,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        train_sampling_strategy="sequential",
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    clock = _Clock()
    hf = Trainer(model=m, args=args, train_dataset=data, callbacks=[clock])
    hf.remove_callback(PrinterCallback)  # its summary line, printed each round
    hf.train()
    return clock.seconds


def distance(m: GPT2LMHeadModel, reference: GPT2LMHeadModel, start: GPT2LMHeadModel) -> float:
    pairs = zip(m.parameters(), reference.parameters(), start.parameters(), strict=True)
    off, moved = 0.0, 0.0
    for p, r, s in pairs:
        off = max(off, (p.double() - r.double()).abs().max().item())
        moved = max(moved, (r.double() - s.double()).abs().max().item())
    return off / moved


def exactness(folder: str) -> str:
    data = SFT()
    lines = [
        "| contender | float32 | float64 |",
        "|---|---:|---:|",
    ]
    rows: dict[str, list[float]] = {"HF Trainer": [], "composetrain": [], "composetrain, unshifted count": []}
    for dtype in (torch.float32, torch.float64):
        start, reference = model(dtype), model(dtype)
        textbook(reference, data)
        runs = {
            "HF Trainer": lambda m: trainer(m, data, folder),
            "composetrain": lambda m: composetrain(m, data),
            "composetrain, unshifted count": lambda m: composetrain(m, data, lambda b: (b["labels"] != PAD).sum()),
        }
        for name, run in runs.items():
            m = model(dtype)
            run(m)
            rows[name].append(distance(m, reference, start))
    for name, (f32, f64) in rows.items():
        lines.append(f"| {name} | {f32:.1e} | {f64:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    hf_logging.set_verbosity_error()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as folder:
        print("## Distance from the large-batch update (relative to the update's size)\n")
        print(exactness(folder))
        data, initial = SFT(), model(torch.float32)

        def timed(run):
            return lambda updates: run(copy.deepcopy(initial))  # the copy is outside the timed loop

        results = compare(
            {
                "HF Trainer": timed(lambda m: trainer(m, data, folder)),
                "composetrain": timed(lambda m: composetrain(m, data)),
            },
            updates=SEQUENCES // BATCH,
            rounds=args.rounds,
        )
        print()
        print(report("Training-loop throughput, float32 (Trainer's set-up excluded)", results, "HF Trainer"))


if __name__ == "__main__":
    main()
