"""The plain step run on a pipeline's stages (internal): the stand-ins for the model that take the first stage's
inputs from it and give the last stage's output to its loss, and the context managers around a stage's forward."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn

from composetrain.transforms._stages import chain

__all__ = ["Replay", "chained", "entered", "stage_inputs"]


class _Captured(Exception):
    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.args, self.kwargs = args, kwargs


class Recorder:
    """The model, for the first stage's run of the plain step: its call's arguments are the stage's inputs."""

    def __init__(self, who: object) -> None:
        self.who = who

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(args, kwargs)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"{self.who!r}: the step reads model.{name}, but under pipeline the step gets a stand-in for the model, "
            "which it may only call, once: model(inputs); read attributes outside the step"
        )


class Replay:
    """The model, for the last stage's run of the plain step: its call returns the stages' output."""

    def __init__(self, output: Any, who: object) -> None:
        self.output, self.who, self.calls = output, who, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.output

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"{self.who!r}: the step reads model.{name}, but under pipeline the step gets a stand-in for the model, "
            "which it may only call, once: model(inputs); read attributes outside the step"
        )

    def check(self) -> None:
        if self.calls != 1:
            raise ValueError(
                f"{self.who!r}: the step called model(...) {self.calls} times; under pipeline it must call it once "
                "(the stages run the model's forward once per micro-batch)"
            )


def stage_inputs(plain: Any, micro: Any, who: object) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """What the plain step passes to ``model(...)`` for this micro-batch: the first stage's inputs."""
    try:
        plain(Recorder(who), micro)
    except _Captured as found:
        return tuple(found.args), dict(found.kwargs)
    raise ValueError(f"{who!r}: the step returned without calling model(...); under pipeline it must call it once")


@contextlib.contextmanager
def entered(hooks: tuple[Any, ...], ctx: Any) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for hook in hooks:
            stack.enter_context(hook(ctx))
        yield


@contextlib.contextmanager
def chained(model: nn.Module, names: list[str]) -> Iterator[None]:
    """``model``'s forward is the chain of ``names`` inside (one process: every stage here, in order)."""
    own = model.__dict__.get("forward")
    run = chain(model, names)
    model.forward = run
    try:
        yield
    finally:
        if own is None:
            del model.forward
        else:
            model.forward = own
