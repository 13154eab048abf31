"""Helpers for error messages (internal)."""

from __future__ import annotations

from typing import Any


def show(value: Any) -> str:
    """A one-line description of a value for error messages: short repr and type."""
    text = " ".join(repr(value).split())
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def name(fn: Any) -> str:
    """How a function is named in reprs and messages."""
    return getattr(fn, "__name__", None) or repr(fn)
