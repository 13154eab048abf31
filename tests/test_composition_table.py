"""docs/composition.md's table is ``core/composition_rules.py``'s: every ordered pair of the transforms, composed
or refused when built, with the reason and the order or transform to use. ``tests/test_composition_rules.py`` builds
every pair; this file checks that the page says the same, and that the order the README and the page give ("an order
that always works") holds under the rules. After changing the rules, print the new table with
``PYTHONPATH=src python tests/test_composition_table.py`` and paste it into docs/composition.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from composetrain.core.composition_rules import FULLGRAPH, REFUSED

ROOT = Path(__file__).resolve().parents[1]

# (role, how the table names it, its column's abbreviation), in the table's order
TRANSFORMS = [
    ("distributed", "distributed", "D"),
    ("sharded", "sharded (replicate=)", "S"),
    ("tensor_parallel", "tensor_parallel", "TP"),
    ("pipeline", "pipeline", "PP"),
    ("accumulate", "accumulate(n)", "A"),
    ("accumulate_auto", 'accumulate("auto")', "AA"),
    ("mixed_precision", "mixed_precision", "MP"),
    ("clip_grad_norm", "clip_grad_norm", "C"),
    ("checkpoint_activations", "checkpoint_activations", "CA"),
    ("compile", "compile", "K"),
    (FULLGRAPH, "compile(fullgraph=True)", "KF"),
    ("ema", "ema", "E"),
    ("data_parallel", "data_parallel", "DP"),
    ("pipeline_split", "pipeline_split", "PS"),
]
NESTS = {"accumulate"}  # the one transform without a role: it may wrap itself


def _roles(role: str) -> set[str]:
    """The roles a step applying ``role`` holds (a fullgraph compile is a compile too)."""
    return {role, "compile"} if role == FULLGRAPH else {role}


def reason(outer: str, inner: str) -> str | None:
    """Why building ``outer(inner(step))`` is refused, as the table says, or None where it composes."""
    for row in [FULLGRAPH, "compile"] if outer == FULLGRAPH else [outer]:  # a fullgraph compile checks both rows
        hit = sorted(r for r in _roles(inner) if (row, r) in REFUSED)
        if hit:
            return REFUSED[row, hit[0]]
    return None


def render() -> str:
    """The table and its notes, in Markdown."""
    notes: dict[str, int] = {}
    lines = [
        "| outer \\ inner | " + " | ".join(short for _, _, short in TRANSFORMS) + " |",
        "|---" * (len(TRANSFORMS) + 1) + "|",
    ]
    for outer, name, short in TRANSFORMS:
        cells = []
        for inner, _, _ in TRANSFORMS:
            why = reason(outer, inner)
            if why is not None:
                cells.append(f"✗{notes.setdefault(why, len(notes) + 1)}")
            elif _roles(outer) & _roles(inner) and outer not in NESTS:
                cells.append("once")
            else:
                cells.append("✓")
        lines.append(f"| `{name}` ({short}) | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{n}. {why}" for why, n in notes.items()]
    return "\n".join(lines) + "\n"


PAGE = ROOT / "docs" / "composition.md"


def test_the_readme_table_is_the_composition_rules():
    assert render() in PAGE.read_text(), "regenerate it: PYTHONPATH=src python tests/test_composition_table.py"


def test_every_refused_pair_of_the_table_is_in_the_readme_table():
    """No rule is left out of the table: each (outer, inner) of REFUSED is a pair of its transforms."""
    roles = {role for role, _, _ in TRANSFORMS}
    assert {role for pair in REFUSED for role in pair} <= roles
    assert all(reason(outer, inner) == REFUSED[outer, inner] for outer, inner in REFUSED if outer != FULLGRAPH)


# -- "an order that always works": the README's and docs/composition.md's order table ---------------------------------

ROLES = {"accumulate(n)": "accumulate", 'accumulate("auto")': "accumulate_auto"}  # the others are named as their role


def order_table(text: str) -> str:
    start = text.index("| from the outside in | transform | not with |")
    return text[start : text.index("\n\n", start)]


def order_rows(table: str) -> list[tuple[str, list[str], set[frozenset[str]]]]:
    """Each row: its place ("anywhere" or a number), its transforms' roles, and the pairs it says are refused."""
    rows = []
    for line in table.splitlines()[2:]:
        place, names, refused = (cell.strip() for cell in line.strip("|").split("|"))
        roles = [ROLES.get(n, n) for n in re.findall(r"`([^`]+)`", names)]
        pairs = set()
        for part in filter(None, (p.strip() for p in refused.split(";"))):
            subject, others = part.split(":")
            for other in re.findall(r"`([^`]+)`", others):
                pairs.add(frozenset({ROLES.get(subject.strip("` "), subject.strip("` ")), ROLES.get(other, other)}))
        rows.append((place, roles, pairs))
    return rows


def order_problems(table: str) -> list[str]:
    """Where the order table and the rules disagree: a pair it says composes that is refused, a pair it lists as refused
    that composes, transforms of one row ("or", "one of") that compose together, a transform left out."""
    rows = order_rows(table)
    listed = set().union(*(pairs for _, _, pairs in rows))
    problems, said_refused = [], set()
    for i, (place, roles, _) in enumerate(rows):
        for a in roles:
            if place != "anywhere":  # one of the row: refused together, in either order
                problems += [
                    f"{a}, {b}: one row, but {a}({b}(...)) composes" for b in roles if b != a and not reason(a, b)
                ]
            for later_place, later, _ in rows[i + 1 :]:
                for b in later:
                    orders = [(a, b), (b, a)] if "anywhere" in (place, later_place) else [(a, b)]
                    for outer, inner in orders:
                        if reason(outer, inner):
                            said_refused.add(frozenset({a, b}))
                            if frozenset({a, b}) not in listed:
                                problems.append(f"{outer}({inner}(...)) is refused, and the table does not say so")
    problems += [f"{sorted(p)}: listed as refused, but composes" for p in listed - said_refused]
    named = {r for _, roles, _ in rows for r in roles}
    problems += [
        f"{role}: not in the order table" for role, _, _ in TRANSFORMS if role != FULLGRAPH and role not in named
    ]
    return problems


@pytest.mark.parametrize("page", ["README.md", "docs/composition.md"])
def test_the_order_table_holds_under_the_composition_rules(page):
    assert order_problems(order_table((ROOT / page).read_text())) == []


def test_an_order_table_that_breaks_a_rule_is_found():
    table = order_table(PAGE.read_text())
    swapped = table.replace("| 2 | `mixed_precision` |", '| 2 | `accumulate("auto")` |').replace(
        '| 3 | `accumulate("auto")` |', "| 3 | `mixed_precision` |"
    )
    assert "accumulate_auto(mixed_precision(...)) is refused, and the table does not say so" in order_problems(swapped)
    unlisted = table.replace("`checkpoint_activations`: `data_parallel`", "").replace(
        ", `checkpoint_activations` |", " |"
    )
    assert order_problems(unlisted) == [
        "checkpoint_activations(data_parallel(...)) is refused, and the table does not say so"
    ]


if __name__ == "__main__":
    print(render(), end="")
