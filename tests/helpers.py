"""Models, steps and comparisons shared by the tests."""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import composetrain as ct

IN, CLASSES = 5, 3


@dataclasses.dataclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor
    tag: str = "pair"


class XY(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


STRUCTURES = ("tuple", "list", "dict", "ordered", "namedtuple", "dataclass", "nested")


def make_batch(size: int, structure: str = "tuple", seed: int = 0, dtype=torch.float64) -> Any:
    """A classification batch of ``size`` samples in the given nesting."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, IN, generator=g, dtype=dtype)
    y = torch.randint(0, CLASSES, (size,), generator=g)
    return {
        "tuple": lambda: (x, y),
        "list": lambda: [x, y],
        "dict": lambda: {"x": x, "y": y, "source": "synthetic"},
        "ordered": lambda: OrderedDict(y=y, x=x),
        "namedtuple": lambda: XY(x, y),
        "dataclass": lambda: Pair(x, y),
        # a 0-dim tensor and strings ride along unsplit
        "nested": lambda: {"inputs": (x, {"scale": torch.tensor(1.0, dtype=dtype)}), "meta": [y, "tag"]},
    }[structure]()


def get_xy(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, (Pair, XY)):
        return batch.x, batch.y
    if isinstance(batch, dict) and "inputs" in batch:
        x, extra = batch["inputs"]
        return x * extra["scale"], batch["meta"][0]
    if isinstance(batch, dict):
        return batch["x"], batch["y"]
    return batch[0], batch[1]


def classify(model: nn.Module, batch: Any):
    """A plain step: mean cross-entropy and accuracy over samples."""
    x, y = get_xy(batch)
    logits = model(x)
    acc = (logits.argmax(-1) == y).to(logits.dtype).mean()
    return F.cross_entropy(logits, y), {"acc": acc, "n_classes": float(CLASSES)}


def mlp(seed: int = 0, dtype=torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, 8), nn.Tanh(), nn.Linear(8, CLASSES)).to(dtype)


def make_state(seed: int = 0, *, model: nn.Module | None = None, optimizer: str = "sgd", scheduler: bool = True):
    model = mlp(seed) if model is None else model
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if scheduler else None
    return ct.TrainState(model, opt, sched)


def assert_states_close(a: ct.TrainState, b: ct.TrainState, *, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    """Same params, optimizer state, scheduler and step (exact when rtol=atol=0)."""
    assert a.step == b.step
    for (na, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=rtol, atol=atol, msg=lambda m, n=na: f"param {n}: {m}")
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for key in sa["state"]:
        for name, va in sa["state"][key].items():
            torch.testing.assert_close(va, sb["state"][key][name], rtol=rtol, atol=atol)
    if a.scheduler is not None:
        assert a.scheduler.state_dict() == b.scheduler.state_dict()


def assert_states_equal(a: ct.TrainState, b: ct.TrainState) -> None:
    assert_states_close(a, b, rtol=0, atol=0)


def snapshot(state: ct.TrainState) -> dict[str, Any]:
    """A deep copy of everything a failed call must leave unchanged, gradients included."""
    return {
        "state": copy.deepcopy(state.state_dict()),
        "grads": [None if p.grad is None else p.grad.clone() for p in state.model.parameters()],
    }


def assert_untouched(state: ct.TrainState, before: dict[str, Any]) -> None:
    now = snapshot(state)
    assert now["state"]["step"] == before["state"]["step"]
    assert now["state"]["scheduler"] == before["state"]["scheduler"]
    for k, v in before["state"]["model"].items():
        assert torch.equal(now["state"]["model"][k], v), k
    assert now["state"]["optimizer"]["param_groups"] == before["state"]["optimizer"]["param_groups"]
    assert now["state"]["optimizer"]["state"].keys() == before["state"]["optimizer"]["state"].keys()
    for key, entries in before["state"]["optimizer"]["state"].items():
        for name, v in entries.items():
            assert torch.equal(now["state"]["optimizer"]["state"][key][name], v)
    assert all(g is None for g in now["grads"]), "a failed call left gradients behind"


def process_group_threads() -> list[str] | None:
    """Names of this process's threads that belong to a gloo process group or its store (Linux only).

    After the group is destroyed none may remain: one left running into the interpreter's
    exit can abort the process ("terminate called without an active exception")."""
    from pathlib import Path

    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None
    names = [(t / "comm").read_text().strip() for t in tasks.iterdir()]
    return [n for n in names if n.startswith(("pt_gloo", "gloo_", "pt_tcpstore"))]


def composed(printed: str, parts: dict[str, Any], step: Any) -> Any:
    """The composition written as the composed step prints, ``step`` standing for the step and ``n`` for the
    accumulation count: ``composed("distributed(accumulate(n)(step))", parts, classify)``. Each transform's
    printed prefix (``"distributed"``, ``"accumulate(n)"``) is a key of ``parts``, outermost first."""
    transforms = []
    rest = printed
    while rest != "step":
        fits = [k for k in parts if rest.startswith(k + "(") and rest.endswith(")")]
        if not fits:
            raise ValueError(f"composed: no transform of {sorted(parts)} begins {rest!r} (in {printed!r})")
        name = max(fits, key=len)
        transforms.append(parts[name])
        rest = rest[len(name) + 1 : -1]
    return ct.compose(*transforms)(step)


def without(printed: str, *names: str) -> str:
    """The printed composition with the transforms ``names`` left out (the single-process reference of a
    distributed one): ``without("distributed(accumulate(n)(step))", "distributed") == "accumulate(n)(step)"``."""
    for name in names:
        while name + "(" in printed:
            start = printed.index(name + "(")
            printed = printed[:start] + printed[start + len(name) + 1 : -1]
    return printed


def reseal(folder):
    """Record anew the checksums of a checkpoint folder's files that a test changed on purpose (state.pt rewritten
    to test what loading does with its content), as ct.run would have written them."""
    from pathlib import Path

    from composetrain.checkpoint.checksums import CHECKSUMS, digest, write_sums

    folder = Path(folder)
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS]
    write_sums(folder, {str(p.relative_to(folder)): digest(p) for p in files})


class Listed(Dataset[Any]):
    """The items of a list, as a map-style Dataset of a type of this module (a ct.cache store records its type)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def labelled(n: int = 12, seed: int = 0) -> list[Any]:
    """``n`` items ``(x, y)``: a float64 row of ``IN`` features drawn from ``seed``, and an int label."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(IN, dtype=torch.float64, generator=g), i % 3) for i in range(n)]


def reads_back(cached: Any, items: list[Any]) -> bool:
    """Whether every item reads back from ``cached`` (one by one, and with one ``__getitems__``) as ``items`` hold it:
    the same types, dtypes, shapes and bits."""
    from composetrain.data.equal import same_item

    together = cached.__getitems__(list(range(len(items))))
    return all(same_item(cached[i], x) and same_item(together[i], x) for i, x in enumerate(items))


def writers_folder(
    store: Any, pid: int, *, old: bool = False, host: str | None = None, tag: str = "0123456789ab"
) -> Any:
    """The temporary folder a writer of ``store`` (process ``pid`` of ``host``: a digest of its name, by default this
    host's) makes beside it, as ``composetrain.data.store.temporary`` names it."""
    from composetrain.data.store import _host

    return store.parent / f".{store.name}.tmp-{'old-' if old else ''}{tag}-{pid}-{host or _host()}"


def gone_pid() -> int:
    """The pid of a process of this host that has ended (a writer that died)."""
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", ""])
    process.wait()
    return process.pid


class StopsAt(Dataset[Any]):
    """20 items ``(x, y)`` whose item 13 raises StopIteration (as ``next()`` on an exhausted iterator inside
    ``__getitem__`` would)."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> Any:
        if i == 13:
            raise StopIteration
        return torch.full((IN,), float(i), dtype=torch.float64), i % 3


def batches_seen(data: Any, epochs: int = 1, **options: Any) -> list[Any]:
    """The batches ``ct.run`` hands the step, in order (over a Dataset: batches of 4, unshuffled, by default)."""
    seen: list[Any] = []

    def record(model: nn.Module, batch: Any) -> Any:
        seen.append(batch)
        return classify(model, batch)

    if not isinstance(data, DataLoader):
        options = {"batch_size": 4, "shuffle": False, "num_workers": 0, **options}
    ct.run(ct.train_step(record), make_state(), data, epochs=epochs, progress=False, **options)
    return seen
