"""shifted_tokens: the unit count of a causal LM's loss, which shifts its labels inside (Hugging Face)."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from composetrain.core.util import show

__all__ = ["shifted_tokens"]


def shifted_tokens(labels_key: str | int = "labels", *, ignore_index: int = -100) -> _ShiftedTokens:
    """A ``weight`` function counting the tokens a causal LM's mean loss averages over.

    A Hugging Face causal LM called with ``labels`` (``GPT2LMHeadModel``, every ``*ForCausalLM``)
    predicts token ``t + 1`` from tokens ``..t``: its loss compares ``logits[:, :-1]`` with
    ``labels[:, 1:]`` and averages over the labels there that are not ``ignore_index``. The
    first label of every sequence is never predicted, so counting it (``(labels != -100).sum()``)
    gives each micro-batch one unit too many per sequence, and accumulation weighs micro-batches
    wrongly (1e-2 of the update on a tiny padded GPT-2, benchmarks/README.md; HF Trainer counts the
    same way for models whose class name lacks "ForCausalLM"). This counts
    ``(labels[..., 1:] != ignore_index).sum()``, so ``accumulate(n, weight=shifted_tokens())`` is the
    update of one loss averaged over every predicted token of the whole batch, also across ranks
    (``distributed`` and ``sharded`` sum the counts). A model that does not shift (token
    classification, a loss you shift yourself before the step) counts ``(labels != -100).sum()``; so do
    encoder-decoder models (T5, BART: the decoder is fed the labels shifted right, and the loss compares
    logits and labels position by position) and masked LMs (``*ForMaskedLM``).

    Args:
        labels_key: where the labels are in a batch: a key of a mapping (a dict, HF's
            ``BatchEncoding``) or an index into a tuple or list (negative from its end: -1 for labels
            last, as ``batch[-1]``). Labels are ``(batch, sequence)``.
        ignore_index: the label that is not predicted (padding, the prompt): the model's
            ``ignore_index``, -100 in Hugging Face and ``F.cross_entropy``.

    Returns:
        ``weight(batch) -> tensor``: the count, a 0-dim integer tensor on the labels' device.

    Example:
        >>> train = ct.accumulate(4, weight=ct.shifted_tokens())(lambda model, b: model(**b).loss)
        >>> ct.distributed(ct.mixed_precision(train))  # the counts summed over ranks
    """
    if isinstance(labels_key, bool) or not isinstance(labels_key, (str, numbers.Integral)):
        raise TypeError(
            f"shifted_tokens: labels_key must be a key (str) of a dict batch or an index (int) into a tuple batch, "
            f"got {show(labels_key)}; e.g. shifted_tokens('labels') or shifted_tokens(1)"
        )
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(
            f"shifted_tokens: ignore_index must be an int (the label the loss skips), got {show(ignore_index)}; "
            "e.g. ignore_index=-100"
        )
    return _ShiftedTokens(labels_key if isinstance(labels_key, str) else int(labels_key), int(ignore_index))


class _ShiftedTokens:
    """The weight function; a class so that it prints as what it counts (``accumulate(4, weight=...)``)."""

    def __init__(self, key: str | int, ignore_index: int) -> None:
        self.key = key
        self.ignore_index = ignore_index
        extra = "" if ignore_index == -100 else f", ignore_index={ignore_index}"
        self.__name__ = f"shifted_tokens({key!r}{extra})"

    def __call__(self, batch: Any) -> torch.Tensor:
        labels = self._labels(batch)
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"{self.__name__}: the labels must be an integer tensor, got {show(labels)}")
        if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:  # bool: never -100
            raise TypeError(
                f"{self.__name__}: the labels must be an integer tensor, got a {labels.dtype} tensor; "
                "give the token ids the loss compares with (-100 where nothing is predicted)"
            )
        if labels.dim() < 2:
            raise ValueError(
                f"{self.__name__}: the labels must be (batch, sequence), got shape {tuple(labels.shape)}: one label "
                "per sequence (sequence classification), whose loss is a mean over sequences, not tokens; leave "
                "weight out: accumulate(n) weighs micro-batches by their sequences"
            )
        # the model predicts labels[..., 1:] from the tokens before them: the first is never a target
        return (labels[..., 1:] != self.ignore_index).sum()

    def _labels(self, batch: Any) -> Any:
        if isinstance(batch, Mapping):
            if "num_items_in_batch" in batch:  # transformers divides the summed loss by it: a mean already
                raise ValueError(
                    f"{self.__name__}: the batch holds num_items_in_batch, by which model(**batch) divides its "
                    "summed loss (HF Trainer's normalisation), and accumulate weighs each micro-batch's loss again: "
                    "the loss divided twice; drop it from the batch (the model then returns its mean loss)"
                )
            if self.key in batch:
                return batch[self.key]
            keys = ", ".join(repr(k) for k in batch)
            raise KeyError(f"{self.__name__}: the batch has no {self.key!r}; its keys are {keys}; give labels_key=")
        if isinstance(batch, Sequence) and not isinstance(batch, str) and isinstance(self.key, int):
            if -len(batch) <= self.key < len(batch):
                return batch[self.key]
            raise IndexError(
                f"{self.__name__}: the batch holds {len(batch)} items, no index {self.key}; give labels_key="
            )
        raise TypeError(
            f"{self.__name__}: cannot find labels {self.key!r} in a batch of type {type(batch).__name__}; "
            "a dict batch takes a key (shifted_tokens('labels')), a tuple batch an index (shifted_tokens(1))"
        )

    def __repr__(self) -> str:
        return self.__name__
