"""Hugging Face transformers models through every transform, against the textbook large-batch update.

A tiny GPT-2 built from a config (no download): token-weighted accumulation with ``ct.shifted_tokens``,
``distributed``, ``sharded`` with its blocks as units (tied embeddings), ``accumulate("auto")``,
``checkpoint_activations`` on its blocks by class, checkpoints of its state_dict, and the ways it fails.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
import torch.nn.functional as F
from helpers import LENGTH, PAD, full, gpt2, lm_loss, sft_batch
from transformers import GPT2LMHeadModel
from transformers.models.gpt2.modeling_gpt2 import GPT2Block
from transformers.utils import logging as hf_logging

import composetrain as ct

hf_logging.set_verbosity_error()  # the config's token ids lie outside the tiny vocabulary: a warning per model

LR = 0.5


def relative(model, reference, start):
    """The largest difference from the reference's parameters, relative to the size of its update."""
    moved = max((r - s).abs().max().item() for r, s in zip(reference.parameters(), start.parameters(), strict=True))
    off = max((p - r).abs().max().item() for p, r in zip(model.parameters(), reference.parameters(), strict=True))
    return off / moved


def trained(train, model, batches):
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=LR))
    for batch in batches:
        train(state, batch)
    return state


@pytest.mark.parametrize(("size", "n"), [(16, 4), (10, 4), (7, 3)])  # even, 3+3+2+2, 3+2+2
def test_shifted_tokens_accumulation_is_the_textbook_update_in_float64(size, n):
    batches = [sft_batch(size, seed) for seed in (1, 2)]
    model, reference, start = gpt2(), gpt2(), gpt2()
    trained(ct.accumulate(n, weight=ct.shifted_tokens())(exact_step), model, batches)
    textbook(reference, batches)
    assert relative(model, reference, start) < 1e-10


@pytest.mark.parametrize(
    "split",
    [ct.data_parallel(["cpu", "cpu"]), ct.pipeline_split({"transformer": "cpu", "lm_head": "cpu"}, chunks=2)],
    ids=["data_parallel", "pipeline_split"],
)
def test_single_process_splits_are_the_textbook_update_and_keep_the_tie(split):
    batches = [sft_batch(8, 1)]
    model, reference, start = gpt2(), gpt2(), gpt2()
    trained(split(ct.accumulate(2, weight=ct.shifted_tokens())(exact_step)), model, batches)
    textbook(reference, batches)
    assert relative(model, reference, start) < 1e-10
    assert model.lm_head.weight is model.transformer.wte.weight


def test_pipeline_chunks_refuse_the_models_own_mean_loss():
    """Each chunk's .loss is a mean over its own tokens: only the step can say how they combine."""
    assert_refused_untouched(
        ct.pipeline_split({"transformer": "cpu", "lm_head": "cpu"}, chunks=2)(lm_loss),
        gpt2(),
        r"the model returns a 0-dim tensor .* return per-sample outputs \(logits\) and compute the loss in the step",
    )


def test_the_models_own_loss_agrees_to_float32_rounding_and_the_unshifted_count_does_not():
    """model(**batch).loss upcasts to float32; the count that includes each sequence's first label is 1e-2 off."""
    batches = [sft_batch(12, 1)]
    reference, start = gpt2(), gpt2()
    textbook(reference, batches)
    right = trained(ct.accumulate(3, weight=ct.shifted_tokens())(lm_loss), gpt2(), batches).model
    wrong = trained(ct.accumulate(3, weight=lambda b: (b["labels"] != -100).sum())(lm_loss), gpt2(), batches).model
    assert relative(right, reference, start) < 1e-5
    assert relative(wrong, reference, start) > 1e-3


@pytest.mark.parametrize("composition", ["distributed", "distributed_auto", "sharded", "sharded_checkpointed"])
def test_two_ranks_equal_the_textbook_update_on_the_global_batch(pool, composition):
    """Ranks hold different numbers of real tokens; shifted_tokens' counts are summed over them."""
    for result in pool.run(__name__, "run_case", composition, 2, [1, 2]):
        for key, want in result["want"].items():
            torch.testing.assert_close(result["got"][key], want, rtol=1e-10, atol=1e-12, msg=key)


def test_sharded_refuses_the_tied_embedding_split_from_its_head(pool):
    for message in pool.run(__name__, "tied_across_units"):
        assert "['transformer.wte.weight', 'lm_head.weight'] are one tensor (tied weights)" in message
        assert "leave the embedding and the output head to the root" in message


def test_checkpointed_blocks_give_bit_identical_updates_with_dropout():
    batches = [sft_batch(6, seed) for seed in (1, 2)]
    dropout = {"resid_pdrop": 0.1, "embd_pdrop": 0.1, "attn_pdrop": 0.1}
    plain, checkpointed = gpt2(**dropout).train(), gpt2(**dropout).train()
    torch.manual_seed(5)
    trained(ct.train_step(exact_step), plain, batches)
    torch.manual_seed(5)
    trained(ct.checkpoint_activations(GPT2Block)(exact_step), checkpointed, batches)
    for (key, p), q in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        assert torch.equal(p, q), key


def assert_refused_untouched(train, model, match):
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=LR))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises((ValueError, TypeError), match=match):
        train(state, sft_batch(4, 0))
    assert state.step == 0
    assert all(p.grad is None for p in model.parameters())
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def checkpointed_by_transformers(model):
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5's name for it
    (enable or model.gradient_checkpointing_enable)()


def test_a_key_value_cache_under_checkpointed_blocks_is_refused_before_backward():
    """GPT-2's default config has use_cache=True: the recomputation would append to the cache again."""
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("GPT-2 passes its blocks a Cache object from transformers 5 on (tuples before)")
    assert_refused_untouched(
        ct.checkpoint_activations(GPT2Block)(lm_loss),
        gpt2(use_cache=True),
        r"checkpoint_activations: GPT2Block was called with a key/value cache \(DynamicCache\).*use_cache=False",
    )


def test_transformers_own_checkpointing_under_checkpoint_activations_is_refused():
    model = gpt2()
    checkpointed_by_transformers(model)
    assert_refused_untouched(
        ct.checkpoint_activations(GPT2Block)(lm_loss),
        model,
        r"GPT2Block is checkpointed by transformers already.*gradient_checkpointing_disable\(\)",
    )


def test_checkpointing_switched_on_in_transformers_after_the_first_update_is_refused_at_the_next():
    model = gpt2()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=LR))
    train = ct.checkpoint_activations(GPT2Block)(lm_loss)
    train(state, sft_batch(4, 0))
    checkpointed_by_transformers(model)
    with pytest.raises(ValueError, match="GPT2Block is checkpointed by transformers already"):
        train(state, sft_batch(4, 1))
    assert state.step == 1


@pytest.mark.parametrize("metrics", [False, True])
def test_a_step_returning_the_model_output_is_told_to_return_its_loss(metrics):
    assert_refused_untouched(
        ct.train_step(lambda model, batch: (model(**batch), {}) if metrics else model(**batch)),
        gpt2(),
        r"not the mapping that holds it, got .*\(CausalLMOutputWithCrossAttentions\); return out\['loss'\] "
        r"\(a transformers output: model\(\*\*batch\).loss\)",
    )


class SFT(torch.utils.data.Dataset):
    def __init__(self, size, seed=7):
        self.batch = sft_batch(size, seed)

    def __len__(self):
        return len(self.batch["labels"])

    def __getitem__(self, i):
        return {k: v[i] for k, v in self.batch.items()}


def test_state_dict_round_trips_through_checkpoints_with_the_tie_kept(tmp_path):
    model = gpt2()
    state = ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    train = ct.accumulate(2, weight=ct.shifted_tokens())(exact_step)
    result = ct.run(train, state, SFT(16), batch_size=8, max_steps=2, checkpoint_dir=tmp_path, progress=False)
    fresh = gpt2(seed=9)
    loaded = ct.TrainState(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2))
    ct.load_checkpoint(loaded, result.checkpoint)
    assert fresh.lm_head.weight is fresh.transformer.wte.weight  # still one tensor
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    batch = sft_batch(8, 3)
    train(state, batch)
    train(loaded, batch)
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_sharded_checkpoints_resume_and_load_bit_exactly_with_the_tie(pool, tmp_path):
    rank0, _ = pool.run(__name__, "sharded_resume", str(tmp_path))
    assert rank0["tied"] and "lm_head.weight" in rank0["straight"]
    for key, value in rank0["straight"].items():
        assert torch.equal(rank0["resumed"][key], value), key
        assert torch.equal(rank0["loaded"][key], rank0["cut"][key]), key
    assert not all(torch.equal(rank0["cut"][k], v) for k, v in rank0["straight"].items())  # 2 and 4 updates differ


@pytest.mark.parametrize("use_cache", [False, True], ids=["loss_logits", "loss_logits_cache"])
def test_a_step_returning_the_models_tuple_output_is_told_to_return_its_first_item(use_cache):
    """return_dict=False gives (loss, logits[, past]): two items looked like (loss, metrics) and the logits were
    blamed as metrics; three were a bare 'must return a loss'."""
    assert_refused_untouched(
        ct.train_step(lambda model, batch: model(**batch, return_dict=False, use_cache=use_cache)),
        gpt2(),
        rf"a tuple of {3 if use_cache else 2} tensors \(a model's output with return_dict=False: loss, logits, "
        r"\.\.\.\); return out\[0\]; metrics go in a mapping",
    )


def test_a_model_output_without_a_loss_is_told_to_pass_labels():
    """transformers computes .loss only when called with labels; the output then holds no 'loss' at all."""
    assert_refused_untouched(
        ct.train_step(lambda model, batch: model(input_ids=batch["input_ids"])),
        gpt2(),
        r"got a mapping with keys \['logits'\] \(CausalLMOutputWithCrossAttentions\) and no 'loss'; .*labels=",
    )


def t5(seed=0):
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(
        num_layers=1,
        d_model=16,
        d_ff=32,
        num_heads=2,
        d_kv=8,
        vocab_size=100,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
        use_cache=False,
    )
    return T5ForConditionalGeneration(config).double()


def bert_mlm(seed=0):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    config = BertConfig(
        num_hidden_layers=1,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        vocab_size=100,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForMaskedLM(config).double()


def unshifted_textbook(model, batches):
    """One loss over every label that is not -100, compared with the logits at its own position."""
    for batch in batches:
        model.zero_grad(set_to_none=True)
        logits, targets = model(**batch).logits, batch["labels"]
        total = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum")
        (total / (targets != -100).sum()).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad


@pytest.mark.parametrize("build", [t5, bert_mlm], ids=["T5ForConditionalGeneration", "BertForMaskedLM"])
def test_models_that_do_not_shift_count_every_label_and_shifted_tokens_is_wrong_for_them(build):
    """What README and shifted_tokens' docstring say: encoder-decoder models (their decoder is fed the labels
    shifted right, the loss compares logits and labels position by position) and masked LMs predict every label."""
    batches = [sft_batch(10, 1)]
    for batch in batches:  # a masked LM predicts the masked tokens only; the same labels for T5 (any will do)
        batch["labels"] = batch["labels"].masked_fill(torch.arange(LENGTH) % 3 != 0, -100)
    reference, start = build(), build()
    unshifted_textbook(reference, batches)
    every_label = trained(ct.accumulate(3, weight=lambda b: (b["labels"] != -100).sum())(lm_loss), build(), batches)
    shifted = trained(ct.accumulate(3, weight=ct.shifted_tokens())(lm_loss), build(), batches)
    assert relative(every_label.model, reference, start) < 1e-10
    assert relative(shifted.model, reference, start) > 1e-3


@pytest.mark.parametrize("count", [torch.tensor, int], ids=["tensor", "int"])
def test_a_batch_holding_num_items_in_batch_is_refused_by_shifted_tokens(count):
    """HF Trainer's way: model(**batch, num_items_in_batch=N) divides the summed loss by N; accumulate then weighs
    each micro-batch's loss by its share again, and the update came out half its size here (the loss divided twice)."""
    batch = sft_batch(8, 1)
    batch["num_items_in_batch"] = count((batch["labels"][:, 1:] != -100).sum().item())
    model = gpt2()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=LR))
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match=r"num_items_in_batch.*divided twice.*drop it from the batch"):
        ct.accumulate(2, weight=ct.shifted_tokens())(lm_loss)(state, batch)
    assert state.step == 0
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_a_split_by_accumulate_auto_that_gathers_sequences_with_nothing_to_predict_names_them():
    """Out of memory above 3 sequences, the 3 prompt-only ones (labels all -100) form a micro-batch of 0 tokens:
    refused before any update, with advice that applies when memory chose the split (not 'fewer micro-batches')."""
    batch = sft_batch(6, 1)
    batch["labels"][3:] = -100
    model = gpt2()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=LR))
    with pytest.raises(ValueError, match=r"micro-batch 2 of 2.*drop the samples that hold none \(sequences whose "):
        ct.accumulate("auto", weight=ct.shifted_tokens())(fits_three)(state, batch)
    assert state.step == 0 and all(p.grad is None for p in model.parameters())


def test_check_judges_the_models_own_float32_loss_at_float32_and_still_names_a_misweighing():
    """issue 29.13: transformers computes .loss in float32 on a float64 GPT-2, so the plain step's gradients carry
    float32 rounding; check's tolerance follows the loss's dtype too. The unshifted count (1e-2 off) still differs."""
    model = gpt2()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=LR))
    wrong = ct.accumulate(3, weight=lambda b: (b["labels"] != -100).sum())(lm_loss)
    for seed in range(8):  # 5 of these 8 differed at float64's tolerance
        batch = sft_batch(12, seed)
        result = ct.check(ct.accumulate(3, weight=ct.shifted_tokens())(lm_loss), state, batch)
        assert result and result.dtype is torch.float64 and result.lowest is torch.float32, result
        assert result.rtol == 1e-4 and "lowest precision involved: float32" in repr(result)
        off = ct.check(wrong, state, batch)
        assert not off and off.diverges_at == "accumulate(3, weight=<lambda>)" and off.grads.relative > 1e-3, off


# -- the textbook update, and what every rank of the pool runs (its ranks import this module by name) -------------
# The textbook update is written out by hand: one loss averaged over every real predicted token
# (``labels[:, 1:] != -100``) of the whole batch, then one plain SGD step; every composition is compared with it.


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
        ct.sharded(lm_loss, modules=["transformer.h.0", "transformer.h.1", "lm_head"])(
            state, shard(sft_batch(4, 0), rank, world)
        )
    except ValueError as error:
        return str(error)
    return "not refused"


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
