"""A griffe extension for the API reference (mkdocs.yml loads it): composetrain's docstrings title their examples
"Example:", which Google style reads as an admonition whose ``>>>`` lines become Markdown (quotes, and
``history[-1]["loss"]`` a reference link); as "Examples:" they are rendered as the doctest code they are."""

from __future__ import annotations

import re
from typing import Any

import griffe

_TITLE = re.compile(r"(?m)^(\s*)Example:[ \t]*$")


class ExampleSections(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _TITLE.sub(r"\1Examples:", obj.docstring.value)
