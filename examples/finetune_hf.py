"""Fine-tune a Hugging Face transformers causal LM with ct.run: padded SFT sequences, exact token weighting.

No download: the model is a small GPT-2 built from a config (``GPT2LMHeadModel(GPT2Config(...))``; swap in
``AutoModelForCausalLM.from_pretrained(...)`` for a real one), and the data are made up: a prompt of 2 to 8
digits, a separator, then the digits reversed and an end token, right-padded. The labels are -100 on the
prompt and on the padding, so only the answer is learnt (supervised fine-tuning style).

The model computes its own loss from ``labels`` and shifts them inside (token t + 1 is predicted from the
tokens up to t), so the loss of a micro-batch is a mean over ``(labels[:, 1:] != -100).sum()`` tokens, not
``(labels != -100).sum()``: ``accumulate(n, weight=ct.shifted_tokens())`` weighs the micro-batches by that
count, and the update is the one of a single loss over every answer token of the whole batch, also across
processes (the counts are summed over ranks). With bf16 autocast, gradient clipping, linear warmup,
each block's activations recomputed in backward, evaluation and checkpoints (rerun to resume).

    python examples/finetune_hf.py --run-dir runs/finetune_hf           # alone; rerun to resume
    torchrun --nproc-per-node=2 examples/finetune_hf.py                  # two processes, DDP

Needs the ``[hf]`` extra (``pip install -e ".[hf]"``: transformers).
"""

from __future__ import annotations

import argparse
import math
import os

import torch
from cli import at_least  # examples/cli.py, beside this script
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

import composetrain as ct

DIGITS, SEP, END, PAD = 10, 10, 11, 12  # token ids: 0-9 are digits; PAD is only ever an input, never a label
IGNORE = -100  # the label the loss skips (transformers and F.cross_entropy)
LONGEST = 8  # digits in the longest prompt
LENGTH = 2 * LONGEST + 2  # prompt, separator, answer, end


class Reversal(Dataset):
    """``count`` sequences "d1 .. dk SEP dk .. d1 END", right-padded to LENGTH; labels only on the answer."""

    def __init__(self, count: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(count):
            k = int(torch.randint(2, LONGEST + 1, (), generator=g))
            digits = torch.randint(0, DIGITS, (k,), generator=g)
            ids = torch.full((LENGTH,), PAD)
            ids[: 2 * k + 2] = torch.cat([digits, torch.tensor([SEP]), digits.flip(0), torch.tensor([END])])
            labels = torch.full((LENGTH,), IGNORE)
            labels[k + 1 : 2 * k + 2] = ids[k + 1 : 2 * k + 2]  # the answer and END: what is learnt
            mask = (torch.arange(LENGTH) < 2 * k + 2).long()
            self.items.append({"input_ids": ids, "attention_mask": mask, "labels": labels})

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.items[i]


def step(model: GPT2LMHeadModel, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss  # the mean over the shifted labels that are not -100


def evaluate(model: GPT2LMHeadModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Held-out loss and the share of answer tokens predicted right (greedy, teacher-forced)."""
    out = model(**batch)
    guess, target = out.logits[:, :-1].argmax(-1), batch["labels"][:, 1:]
    answer = target != IGNORE
    return {"loss": out.loss, "token_acc": (guess == target)[answer].float().mean()}


def main(argv: list[str] | None = None) -> ct.RunResult:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=at_least(1), default=8)
    parser.add_argument("--samples", type=at_least(1), default=2048, help="training sequences per epoch")
    parser.add_argument("--eval-samples", type=at_least(1), default=256, help="held-out sequences")
    parser.add_argument("--batch-size", type=at_least(1), default=32, help="sequences per update, per process")
    parser.add_argument("--accumulate", type=at_least(1), default=4, help="micro-batches per update")
    parser.add_argument("--width", type=at_least(2), default=64, help="n_embd, a multiple of the 2 heads")
    parser.add_argument("--layers", type=at_least(1), default=2)
    parser.add_argument("--warmup", type=at_least(0), default=20, help="updates of linear warmup")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument("--run-dir", default=None, help="checkpoint here (rerun to resume)")
    args = parser.parse_args(argv)
    if args.width % 2:
        parser.error(f"--width {args.width} must be a multiple of the 2 attention heads, e.g. 64")
    hf_logging.set_verbosity_error()  # the config's default token ids (50256) lie outside this vocabulary

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=PAD + 1,
        n_positions=LENGTH,
        n_embd=args.width,
        n_layer=args.layers,
        n_head=2,
        use_cache=False,  # no key/value cache in training: a checkpointed block would fill it twice
    )
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    updates = args.epochs * math.ceil(args.samples / (args.batch_size * world))
    decay = max(updates - args.warmup, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, ct.warmup(args.warmup, then=lambda i: 0.5 * (1 + math.cos(math.pi * min(i / decay, 1.0))))
    )
    state = ct.TrainState(model, optimizer, schedule)

    block = type(model.transformer.h[0])  # GPT2Block: checkpoint every block, whatever the model's class
    train_step = ct.compose(
        ct.distributed,
        ct.clip_grad_norm(1.0),
        ct.mixed_precision(dtype=args.precision),
        ct.checkpoint_activations(block),
        ct.accumulate(args.accumulate, weight=ct.shifted_tokens()),  # the tokens the shifted loss averages
    )(step)
    result = ct.run(
        train_step,
        state,
        Reversal(args.samples, seed=0),
        batch_size=args.batch_size,
        epochs=args.epochs,
        eval_step=evaluate,
        eval_data=Reversal(args.eval_samples, seed=1),
        log_every=10,
        checkpoint_dir=args.run_dir,
    )

    if int(os.environ.get("RANK", "0")) == 0:
        for record in result.evals:
            print(
                f"epoch {record['epoch']}  step {record['step']:4d}  held-out loss {record['loss']:.3f}  "
                f"answer tokens right {record['token_acc']:.3f}"
            )
        print(f"{train_step}: final train loss {result.history[-1]['loss']:.3f}")
    return result


if __name__ == "__main__":
    main()
