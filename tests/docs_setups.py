"""What the documentation's python blocks assume, by name: ``<!-- setup: NAME -->`` before a block adds ``NAME``'s
names to the namespace its page's blocks run in (tests/test_docs.py). Each gives small settings: a few dozen samples,
models of a few hundred parameters, so that every page runs in seconds."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import composetrain as ct


class Env:
    """Where a page runs: its working folder (a fresh temporary one) and pytest's monkeypatch."""

    def __init__(self, folder: Path, monkeypatch: Any) -> None:
        self.folder, self.monkeypatch = folder, monkeypatch


def _basics() -> dict[str, Any]:
    return {"torch": torch, "F": F, "nn": nn, "np": np, "ct": ct}


def digits64(env: Env) -> dict[str, Any]:
    """The README's quick example's data: 64 features, 10 classes."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=g)
    return {"dataset": TensorDataset(x, torch.randint(0, 10, (256,), generator=g))}


class Block(nn.Module):
    """A residual layer: what ``modules=Block`` and ``checkpoint_activations(Block)`` name."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


def classifier(env: Env) -> dict[str, Any]:
    """A small MLP classifier (8 features, 4 classes), its state, a plain step and an evaluation step, 64 training and
    32 held-out samples, one batch and a loader of batches of 16."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    dataset, held_out = TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), Block(16), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def step(model: nn.Module, batch: Any) -> Any:
        x, y = batch
        logits = model(x)
        return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).float().mean()}

    def evaluate(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        x, y = batch
        logits = model(x)
        return {"loss": F.cross_entropy(logits, y), "acc": (logits.argmax(-1) == y).float().mean()}

    loader = DataLoader(dataset, batch_size=16)
    return {
        **_basics(),
        "Block": Block,
        "model": model,
        "optimizer": optimizer,
        "state": ct.TrainState(model, optimizer),
        "step": step,
        "train_step": ct.train_step(step),
        "evaluate": evaluate,
        "dataset": dataset,
        "train_dataset": dataset,
        "test_dataset": held_out,
        "val": held_out,
        "batch": next(iter(loader)),
        "loader": loader,
        "epochs": 3,
    }


def hf_step(env: Env) -> dict[str, Any]:
    """A Hugging Face model's step: the model's own loss."""

    def hf_step(model: nn.Module, batch: Any) -> Any:
        return model(**batch).loss

    return {"hf_step": hf_step}


class _Tokens(Dataset[dict[str, torch.Tensor]]):
    """Right-padded sequences of token ids with labels (-100 on the padding), as dicts."""

    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, vocab, (n, length), generator=g)
        real = torch.randint(2, length + 1, (n,), generator=g)
        self.mask = torch.arange(length)[None] < real[:, None]
        self.labels = self.ids.masked_fill(~self.mask, -100)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def lm_tokens(env: Env) -> dict[str, Any]:
    """A tiny causal LM over padded dict batches; its step shifts the labels inside its loss, as transformers' do."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32))

    def step(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = model(batch["input_ids"])[:, :-1]
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100)

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return {
        **_basics(),
        "model": model,
        "step": step,
        "state": ct.TrainState(model, optimizer),
        "dataset": _Tokens(48, 12, 32),
    }


def gpt2(env: Env) -> dict[str, Any]:
    """transformers' GPT-2 classes (``[hf]``)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    return {**_basics(), "GPT2Config": GPT2Config, "GPT2LMHeadModel": GPT2LMHeadModel, "GPT2Block": GPT2Block}


def ema_recipe(env: Env) -> dict[str, Any]:
    """torchvision's recipe's command-line numbers, small: 64 samples in batches of 16."""
    return {"world_size": 1, "batch_size": 16, "ema_steps": 2, "epochs": 2, "warmup_epochs": 1, "updates_per_epoch": 4}


class DecodedImages(Dataset[tuple[torch.Tensor, int]]):
    """Stands for a folder of image files decoded per item: 40 one-channel 8x8 images, 4 classes."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        return torch.rand(1, 8, 8, generator=g), i % 4


def _image_classifier(inputs: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(inputs, 4))

    def step(model: nn.Module, batch: Any) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x.float()), y)

    return {"model": model, "step": step, "state": ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))}


def images(env: Env) -> dict[str, Any]:
    """``DecodedImages(root)``, a model for its images and its state; ``scratch/`` for the stores."""
    (env.folder / "scratch").mkdir()
    return {"DecodedImages": DecodedImages, "root": "images", **_image_classifier(64)}


def hdf5_file(env: Env) -> dict[str, Any]:
    """``scratch/imagenet64.h5``: 32 uint8 images of 3x8x8 and their labels (needs h5py), a model for them."""
    import h5py

    (env.folder / "scratch").mkdir()
    g = np.random.default_rng(0)
    with h5py.File(env.folder / "scratch" / "imagenet64.h5", "w") as f:
        f["images"] = g.integers(0, 256, (32, 3, 8, 8), dtype=np.uint8)
        f["labels"] = g.integers(0, 4, 32, dtype=np.int64)
    return _image_classifier(3 * 8 * 8)


class _Bytes:
    """A byte-level tokenizer: each byte a token."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode())


class _TinyLM(nn.Module):
    """Token ids -> next-token logits, with one attention layer that takes positions and a mask."""

    def __init__(self, vocab: int, width: int = 16) -> None:
        super().__init__()
        self.embed, self.position = nn.Embedding(vocab, width), nn.Embedding(64, width)
        self.qkv, self.head = nn.Linear(width, 3 * width), nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor, position_ids: Any = None, mask: Any = None) -> torch.Tensor:
        positions = torch.arange(ids.shape[-1]) if position_ids is None else position_ids
        h = self.embed(ids) + self.position(positions)
        q, k, v = self.qkv(h).unsqueeze(1).chunk(3, dim=-1)
        causal = mask is None
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal).squeeze(1)
        return self.head(h + attended)


def token_shards(env: Env) -> dict[str, Any]:
    """Two shards of ten short documents, a byte tokenizer with its end-of-text id, a tiny LM, its state and
    ``lm_step``; ``data/`` for the shards."""
    import glob

    (env.folder / "data").mkdir()
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "composetrain", "trains"]
    shards = [
        [" ".join(words[(n + i) % len(words) :] + words[: (n + i) % len(words)]) for i in range(10)] for n in (0, 3)
    ]
    torch.manual_seed(0)
    model = _TinyLM(257)

    def lm_step(model: nn.Module, batch: Any) -> torch.Tensor:
        inputs, targets = batch
        return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())

    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return {
        **_basics(),
        "glob": glob,
        "shards": shards,
        "tokenizer": _Bytes(),
        "eot": 256,
        "model": model,
        "lm_step": lm_step,
        "state": state,
    }


def packed_model(env: Env) -> dict[str, Any]:
    """Documents of 5 to 40 token ids, a tiny LM that takes ``position_ids`` and ``mask``, and its state."""
    g = torch.Generator().manual_seed(0)
    documents = [
        torch.randint(0, 50, (int(n),), generator=g).tolist() for n in torch.randint(5, 41, (24,), generator=g)
    ]
    torch.manual_seed(0)
    model = _TinyLM(50)
    return {
        **_basics(),
        "documents": documents,
        "model": model,
        "state": ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1)),
    }


def stream_items(env: Env) -> dict[str, Any]:
    """64 samples of 8 features, as a list."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    return {"items": [(x[i], int(x[i, 0] > 0)) for i in range(64)]}


def fake_trackers(env: Env) -> dict[str, Any]:
    """``wandb`` and ``mlflow`` stand-ins (neither is a test dependency) that keep what they are given."""
    logged: list[tuple[str, int, dict[str, Any]]] = []

    def log(values: dict[str, Any], step: int) -> None:
        logged.append(("wandb", step, values))

    def log_metrics(values: dict[str, Any], step: int) -> None:
        logged.append(("mlflow", step, values))

    def start_run(run_id: str | None = None, run_name: str | None = None) -> Any:
        return types.SimpleNamespace(info=types.SimpleNamespace(run_id=run_id or f"id-of-{run_name}"))

    wandb = types.SimpleNamespace(init=lambda **kwargs: None, log=log, finish=lambda: None)
    mlflow = types.SimpleNamespace(start_run=start_run, log_metrics=log_metrics, end_run=lambda: None)
    env.monkeypatch.setitem(sys.modules, "wandb", types.ModuleType("wandb"))
    env.monkeypatch.setitem(sys.modules, "mlflow", types.ModuleType("mlflow"))
    vars(sys.modules["wandb"]).update(vars(wandb))
    vars(sys.modules["mlflow"]).update(vars(mlflow))
    return {"logged": logged}


class _SFT(Dataset[dict[str, torch.Tensor]]):
    """benchmarks/bench_hf.py's data, small: right-padded sequences with labels -100 on the padding."""

    def __init__(self, n: int = 64, length: int = 16) -> None:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(1, 64, (n, length), generator=g)
        real = torch.randint(4, length + 1, (n,), generator=g)
        self.mask = (torch.arange(length)[None] < real[:, None]).long()
        self.ids = ids * self.mask
        self.labels = self.ids.masked_fill(self.mask == 0, -100)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


def sft(env: Env) -> dict[str, Any]:
    """A tiny GPT-2 from a config (no download, dropout off) and padded SFT-style sequences (``[hf]``)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=64,
        n_positions=16,
        use_cache=False,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return {**_basics(), "model": GPT2LMHeadModel(config), "data": _SFT()}


class _Images(Dataset[tuple[torch.Tensor, int]]):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x, self.y = torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 1000, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.x[i], int(self.y[i])


def timm_data(env: Env) -> dict[str, Any]:
    """16 training and 8 held-out 3x32x32 images of 1000 classes, an evaluation step reporting ``top1``, and the
    updates per epoch of batches of 8 (needs timm)."""

    def evaluate(model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        x, y = batch
        return {"top1": (model(x).argmax(-1) == y).float().mean()}

    return {**_basics(), "dataset": _Images(16, 0), "val": _Images(8, 1), "evaluate": evaluate, "updates_per_epoch": 2}


SETUPS = {
    f.__name__: f
    for f in (
        digits64,
        classifier,
        hf_step,
        lm_tokens,
        gpt2,
        ema_recipe,
        images,
        hdf5_file,
        token_shards,
        packed_model,
        stream_items,
        fake_trackers,
        sft,
        timm_data,
    )
}
