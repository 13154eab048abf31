"""A tiny Hugging Face GPT-2 (built from a config, no download), padded SFT batches and the textbook update;
cases run on every rank of a processes.Pool for tests/test_hf.py, and their single-process references.

The textbook update is written out by hand: one loss averaged over every real predicted token
(``labels[:, 1:] != -100``) of the whole batch, then one plain SGD step; every composition is compared with it.
A module of its own, because the spawned ranks of ``processes.Pool`` import it by name.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.models.gpt2.modeling_gpt2 import GPT2Block
from transformers.utils import logging as hf_logging

import composetrain as ct

hf_logging.set_verbosity_error()  # the config's token ids lie outside the tiny vocabulary: a warning per model

VOCAB, LENGTH, PAD, LR = 100, 16, -100, 0.5


def gpt2(seed: int = 0, dtype: torch.dtype = torch.float64, **overrides: Any) -> GPT2LMHeadModel:
    """The issue's tiny GPT-2, without dropout (so that ranks and micro-batches are exactly comparable)."""
    torch.manual_seed(seed)
    options: dict[str, Any] = {
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 64,
        "vocab_size": VOCAB,
        "n_positions": 32,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "use_cache": False,
    }
    options.update(overrides)
    return GPT2LMHeadModel(GPT2Config(**options)).to(dtype)


def sft_batch(size: int, seed: int, lengths: tuple[int, int] = (4, LENGTH)) -> dict[str, torch.Tensor]:
    """``size`` right-padded sequences of ``lengths`` real tokens; labels -100 on the padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (size, LENGTH), generator=g)
    real = torch.randint(lengths[0], lengths[1] + 1, (size,), generator=g)
    mask = (torch.arange(LENGTH)[None] < real[:, None]).long()
    ids = ids * mask  # pad id 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, PAD)}


def step(model, batch):
    """The usual Hugging Face step. Its loss is computed in float32 (transformers upcasts the logits), so it
    agrees with the float64 textbook to float32 rounding; ``exact_step`` keeps the model's dtype."""
    return model(**batch).loss


def exact_step(model, batch):
    """The same loss as the model's (shifted, mean over real predicted tokens), in the model's dtype."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=PAD)


def textbook(model: GPT2LMHeadModel, batches: list[dict[str, torch.Tensor]], lr: float = LR) -> None:
    """One loss averaged over every predicted real token of the whole batch, one SGD step per batch."""
    for batch in batches:
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        targets = batch["labels"][:, 1:]
        total = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=PAD, reduction="sum")
        (total / (targets != PAD).sum()).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad


def fits_three(model, batch):
    """exact_step, out of memory above 3 sequences: accumulate("auto") must split a rank's 6 in two."""
    if batch["input_ids"].shape[0] > 3:
        raise torch.OutOfMemoryError("CUDA out of memory (injected)")
    return exact_step(model, batch)


def full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def shard(batch: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    return {k: v.tensor_split(world)[rank] for k, v in batch.items()}


def build(composition: str, n: int) -> ct.TrainStep:
    weight = ct.shifted_tokens()
    inner = ct.accumulate(n, weight=weight)(exact_step)
    if composition == "distributed":
        return ct.distributed(inner)
    if composition == "distributed_auto":
        return ct.distributed(ct.accumulate("auto", weight=weight)(fits_three))
    if composition == "sharded":
        return ct.sharded(inner, modules=GPT2Block)
    if composition == "sharded_checkpointed":
        return ct.sharded(ct.checkpoint_activations(GPT2Block)(inner), modules=GPT2Block)
    raise ValueError(composition)


def run_case(rank: int, world: int, composition: str, n: int, seeds: list[int]) -> dict[str, Any]:
    """The ranks' updates on their shards of the global batches; the ranks start from different weights
    (rank 0's are broadcast). Rank 0 also runs the textbook update on the global batches, in one process."""
    model = gpt2(seed=rank)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=LR))
    train = build(composition, n)
    batches = [sft_batch(12, s) for s in seeds]
    for batch in batches:
        train(state, shard(batch, rank, world))
    got = {k: full(v) for k, v in state.model.state_dict().items()}
    reference = gpt2(seed=0)
    textbook(reference, batches)
    state.release_runtime()
    return {"got": got, "want": {k: v.detach().clone() for k, v in reference.state_dict().items()}}


def tied_across_units(rank: int, world: int) -> str:
    """lm_head made a unit of its own while its weight is wte's, which stays in the root: the refusal's text."""
    model = gpt2(seed=0)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=LR))
    try:
        ct.sharded(step, modules=["transformer.h.0", "transformer.h.1", "lm_head"])(
            state, shard(sft_batch(4, 0), rank, world)
        )
    except ValueError as error:
        return str(error)
    return "not refused"


class SFT(torch.utils.data.Dataset):
    def __init__(self, size: int, seed: int) -> None:
        self.batch = sft_batch(size, seed)

    def __len__(self) -> int:
        return len(self.batch["labels"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.batch.items()}


def sharded_resume(rank: int, world: int, folder: str) -> dict[str, Any]:
    """Sharded GPT-2 (tied wte/lm_head in the root unit) through ct.run: 2 updates then resumed to 4, against 4
    straight; and the 2-update checkpoint loaded into a fresh sharded state. Whole state dicts, gathered."""
    train = ct.sharded(ct.accumulate(2, weight=ct.shifted_tokens())(exact_step), modules=GPT2Block)
    options = {"batch_size": 4, "num_workers": 0, "progress": False, "seed": 1}

    def fresh() -> ct.TrainState:
        model = gpt2(seed=0)
        return ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-2))

    data = SFT(8 * world, 5)
    straight, cut, resumed, loaded = fresh(), fresh(), fresh(), fresh()
    ct.run(train, straight, data, max_steps=4, checkpoint_dir=f"{folder}/a", **options)
    saved = ct.run(train, cut, data, max_steps=2, checkpoint_dir=f"{folder}/b", **options).checkpoint
    ct.run(train, resumed, data, max_steps=4, checkpoint_dir=f"{folder}/b", **options)
    ct.apply_sharding(train, loaded)
    ct.load_checkpoint(loaded, saved)
    found = {
        name: ct.full_state_dict(state.model)
        for name, state in (("straight", straight), ("resumed", resumed), ("cut", cut), ("loaded", loaded))
    }
    found["tied"] = loaded.model.lm_head.weight is loaded.model.transformer.wte.weight
    for state in (straight, cut, resumed, loaded):
        state.release_runtime()
    return found
