"""The proof of packing: the einops GPT of examples/language_model.py given packed rows, their position ids and the
block-causal document mask computes, for every token, the loss it computes on that document alone, unpadded; the
gradients of the summed losses are equal (float64, 1e-12); and accumulate(n, weight=labelled tokens) over packed
rows makes the update of the whole batch."""

import copy
import importlib.util
import sys
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given

import composetrain as ct

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
VOCAB, SEQ = 11, 12
TOL = {"rtol": 1e-12, "atol": 1e-12}


def example(name):
    pytest.importorskip("einops")
    pytest.importorskip("sklearn")
    if str(EXAMPLES) not in sys.path:  # as when run as a script: examples/cli.py sits beside it
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LM = example("language_model")


def gpt(seed=0):
    torch.manual_seed(seed)
    return LM.GPT(VOCAB, SEQ, width=16, depth=2, heads=4).double()


def token_losses(model, batch, mask):
    logits = model(batch["input_ids"], position_ids=batch["position_ids"], mask=mask)
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction="none").view(
        batch["labels"].shape
    )


def whole(packed):
    return {k: v.clone() for k, v in packed.rows.items()}


corpus = st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=SEQ), min_size=1, max_size=8)


@given(corpus, st.sampled_from(["first_fit", "greedy"]))
def test_a_packed_batch_gives_each_document_the_losses_and_gradients_it_has_alone(docs, method):
    packed = ct.pack(docs, SEQ, method=method)
    batch = whole(packed)
    model, alone = gpt(), gpt()
    losses = token_losses(model, batch, ct.document_mask(batch["document_ids"]))
    assert bool((losses[batch["labels"] == -100] == 0).all())  # nothing predicted across a boundary or on padding
    total_alone = torch.zeros((), dtype=torch.float64)
    for expected, (row, column, length) in losses_alone(alone, docs, packed):
        torch.testing.assert_close(losses[row, column : column + length - 1], expected, **TOL)
        total_alone = total_alone + expected.sum()
    losses.sum().backward()
    total_alone.backward()
    for (name, p), q in zip(model.named_parameters(), alone.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=name)


def losses_alone(model, docs, packed):
    """Each piece's token losses computed on its document alone (positions from 0, causal, no padding), and where
    the piece lies: (losses, (row, column, length))."""
    for d, _, length, row, column in packed.pieces.tolist():
        ids = torch.tensor([docs[d]])
        logits = model(ids)
        yield F.cross_entropy(logits[0, :-1], ids[0, 1:], reduction="none"), (row, column, length)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_block_mask_gives_each_document_the_losses_it_has_alone():
    pytest.importorskip("torch.nn.attention.flex_attention")
    docs = [[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 1, 2], [3] * 11, [4, 5], [6] * 7]
    packed = ct.pack(docs, SEQ)
    batch = whole(packed)
    model = gpt()
    with torch.no_grad():  # flex_attention has no backward on the CPU (torch 2.14): the forward is compared
        losses = token_losses(model, batch, ct.document_block_mask(batch["document_ids"], block_size=4))
        for expected, (row, column, length) in losses_alone(model, docs, packed):
            torch.testing.assert_close(losses[row, column : column + length - 1], expected, **TOL)


def test_without_the_mask_attention_crosses_documents_and_the_losses_differ():
    packed = ct.pack([[1, 2, 3, 4, 5], [6, 7, 8], [9, 10, 1, 2]], SEQ)
    batch = whole(packed)
    with_mask = token_losses(gpt(), batch, ct.document_mask(batch["document_ids"]))
    causal_only = token_losses(gpt(), batch, None)
    first = packed.pieces[0, 2] - 1  # the first document's labels see nothing before them: equal
    assert torch.equal(with_mask[0, :first], causal_only[0, :first])
    assert not torch.allclose(with_mask[0, first:], causal_only[0, first:])  # later documents see earlier ones


def lm_step(model, batch):
    logits = model(batch["input_ids"], position_ids=batch["position_ids"], mask=ct.document_mask(batch["document_ids"]))
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())  # mean over labelled tokens


def labelled(batch):
    return (batch["labels"] != -100).sum()


# two tokens at least: every row then holds a label, as accumulate's weight needs of every micro-batch
@given(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=SEQ), min_size=2, max_size=14), st.data())
def test_accumulation_over_packed_rows_weighted_by_labelled_tokens_is_the_whole_batch(docs, data):
    packed = ct.pack(docs, SEQ, method="greedy")
    n = data.draw(st.integers(1, len(packed)), label="n")
    batch = whole(packed)
    states = []
    for build in (ct.train_step, ct.accumulate(n, weight=labelled)):
        model = gpt()
        state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        out = build(lm_step)(state, copy.deepcopy(batch))
        states.append((state, out))
    (a, out_a), (b, out_b) = states
    torch.testing.assert_close(out_a.loss, out_b.loss, **TOL)
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOL)
