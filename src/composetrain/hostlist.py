"""SLURM host lists: ``node[01-04,07],gpu-[1-2]-[3,5]`` expanded to host names."""

from __future__ import annotations

import re

from composetrain._util import show

__all__ = ["parse_nodelist"]


def parse_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM host list: ``"node[01-03,07],gpu-[1-2]-[3,5]"`` -> every host name, in order.

    Zero padding follows each range's lower bound (``[08-10]`` gives 08, 09, 10).

    Raises:
        ValueError: the list is empty or malformed (unbalanced or nested brackets,
            a range whose start exceeds its end, a non-numeric range).

    Example:
        >>> parse_nodelist("10.0.0.[089,100-101]")
        ['10.0.0.089', '10.0.0.100', '10.0.0.101']
    """
    if not isinstance(nodelist, str) or not nodelist.strip():
        raise ValueError(f"parse_nodelist: the host list is empty or not a string, got {show(nodelist)}")
    hosts: list[str] = []
    for item in _split_top_level(nodelist.strip(), nodelist):
        expanded = [""]
        for text, bracket in re.findall(r"([^\[\]]+)|\[([^\[\]]*)\]", item):
            choices = [text] if text else _expand_ranges(bracket, nodelist)
            expanded = [head + choice for head in expanded for choice in choices]
        hosts.extend(expanded)
    return hosts


def _split_top_level(nodelist: str, whole: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, char in enumerate(nodelist):
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"parse_nodelist: nested brackets at position {i} of {whole!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"parse_nodelist: ']' without '[' at position {i} of {whole!r}")
        elif char == "," and depth == 0:
            items.append(nodelist[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"parse_nodelist: unbalanced brackets in {whole!r}")
    items.append(nodelist[start:])
    if any(not item.strip() for item in items):
        raise ValueError(f"parse_nodelist: an empty host name in {whole!r}")
    return items


def _expand_ranges(ranges: str, whole: str) -> list[str]:
    out: list[str] = []
    for part in ranges.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if match is None:
            raise ValueError(f"parse_nodelist: {part!r} in {whole!r} is not a number or a range like 01-04")
        start, stop = match.group(1), match.group(2) or match.group(1)
        if int(start) > int(stop):
            raise ValueError(f"parse_nodelist: the range {part!r} in {whole!r} runs backwards")
        out.extend(str(i).zfill(len(start)) for i in range(int(start), int(stop) + 1))
    return out
