"""SLURM host lists: ``node[01-04,07],gpu-[1-2]-[3,5]`` expanded to host names, or summarised (first host,
count) without expanding them."""

from __future__ import annotations

import math
import re

from composetrain.core.util import show

__all__ = ["MAX_HOSTS", "nodelist_summary", "parse_nodelist"]


MAX_HOSTS = 1_000_000  # far above any SLURM cluster; a longer expansion is a typo, not a job

_MAX_DIGITS = 20  # SLURM reads host numbers as unsigned longs; int() refuses strings past 4300 digits


def parse_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM host list: ``"node[01-03,07],gpu-[1-2]-[3,5]"`` -> every host name, in order.

    Zero padding follows each range's lower bound (``[08-10]`` gives 08, 09, 10). Spaces around
    the names (``"node1, node2"``) are dropped.

    Raises:
        ValueError: the list is empty or malformed (unbalanced or nested brackets,
            a range whose start exceeds its end, a non-numeric range, a space inside a name), or
            it names more than ``MAX_HOSTS`` hosts (``nodelist_summary`` counts them without expanding).

    Example:
        >>> parse_nodelist("10.0.0.[089,100-101]")
        ['10.0.0.089', '10.0.0.100', '10.0.0.101']
    """
    items = _parse(nodelist)
    count = sum(_count(item) for item in items)
    if count > MAX_HOSTS:
        raise ValueError(
            f"parse_nodelist: {nodelist!r} names {count} hosts, more than {MAX_HOSTS}; check the list, or use "
            "nodelist_summary for the first host and the count"
        )
    hosts: list[str] = []
    for item in items:
        expanded = [""]
        for part in item:
            choices = (
                [part] if isinstance(part, str) else [_pad(i, a) for a, b in part for i in range(int(a), int(b) + 1)]
            )
            expanded = [head + choice for head in expanded for choice in choices]
        hosts.extend(expanded)
    return hosts


def nodelist_summary(nodelist: str) -> tuple[str, int]:
    """The first host of a SLURM host list and how many it names, without expanding it (what the
    rendezvous needs: ``node[0-20000000]`` takes no memory). Malformed lists raise as in ``parse_nodelist``.

    Example:
        >>> nodelist_summary("node[07-09],login")
        ('node07', 4)
    """
    items = _parse(nodelist)
    first = "".join(part if isinstance(part, str) else part[0][0] for part in items[0])
    return first, sum(_count(item) for item in items)


# a host list item: text parts, and bracket parts as lists of (start, stop) digit strings
_Item = list[str | list[tuple[str, str]]]


def _parse(nodelist: str) -> list[_Item]:
    if not isinstance(nodelist, str) or not nodelist.strip():
        raise ValueError(f"parse_nodelist: the host list is empty or not a string, got {show(nodelist)}")
    items: list[_Item] = []
    for item in _split_top_level(nodelist.strip(), nodelist):
        name = item.strip()
        if any(c.isspace() for c in name):
            raise ValueError(f"parse_nodelist: {name!r} in {nodelist!r} holds a space; separate names with commas")
        items.append(
            [text or _ranges(bracket, nodelist) for text, bracket in re.findall(r"([^\[\]]+)|\[([^\[\]]*)\]", name)]
        )
    return items


def _count(item: _Item) -> int:
    return math.prod(1 if isinstance(p, str) else sum(int(b) - int(a) + 1 for a, b in p) for p in item)


def _pad(number: int, like: str) -> str:
    return str(number).zfill(len(like))


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


def _ranges(ranges: str, whole: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for part in ranges.split(","):
        match = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", part.strip())  # ASCII digits, as SLURM's strtoul reads
        if match is None:
            raise ValueError(f"parse_nodelist: {part!r} in {whole!r} is not a number or a range like 01-04")
        start, stop = match.group(1), match.group(2) or match.group(1)
        if max(len(start), len(stop)) > _MAX_DIGITS:
            raise ValueError(
                f"parse_nodelist: {show(part)} in the host list has more digits than a host number can "
                f"({_MAX_DIGITS}); check the list"
            )
        if int(start) > int(stop):
            raise ValueError(f"parse_nodelist: the range {part!r} in {whole!r} runs backwards")
        out.append((start, stop))
    return out
