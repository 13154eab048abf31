"""PyTorch Lightning as a benchmark contender: its Trainer timed on its updates alone."""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch


class Batches:
    """A plain iterable of ready batches (Lightning reads a list as several loaders)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def lightning(
    model: torch.nn.Module,
    items: list[Any],
    step: Callable[[torch.nn.Module, Any], torch.Tensor],
    optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
    *,
    per_update: int = 1,
    device: str = "cpu",
    **trainer_options: Any,
) -> Callable[[int], float]:
    """A contender ``run(updates) -> seconds`` that fits a fresh Trainer for ``updates`` + 1
    updates and times all but the first (the Trainer's warm-up and set-up are not counted).

    ``per_update`` is how many loader batches make one update (accumulate_grad_batches).
    """
    import lightning.pytorch as pl

    logging.getLogger("lightning").setLevel(logging.ERROR)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    def synchronize() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, _: int) -> torch.Tensor:
            return step(self.model, batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return optimizer(self.model)

    class Clock(pl.Callback):
        def on_train_batch_start(self, trainer: Any, *_: Any) -> None:
            if trainer.fit_loop.total_batch_idx == per_update:  # the second update starts
                synchronize()
                self.start = time.perf_counter()

        def on_train_end(self, *_: Any) -> None:
            synchronize()
            self.end = time.perf_counter()

    def run(updates: int) -> float:
        clock = Clock()
        trainer = pl.Trainer(
            accelerator=device,
            max_steps=updates + 1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[clock],
            **trainer_options,
        )
        needed = (updates + 1) * per_update
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.fit(Module(), train_dataloaders=Batches(items * (1 + needed // len(items))))
        return clock.end - clock.start

    return run
