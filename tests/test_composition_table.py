"""The README's composition table is ``core/composition_rules.py``'s: every ordered pair of the transforms, composed
or refused when built, with the reason and the order or transform to use. ``tests/test_composition_rules.py`` builds
every pair; this file checks that the README says the same. After changing the rules, print the new table with
``PYTHONPATH=src python tests/test_composition_table.py`` and paste it into the README.
"""

from __future__ import annotations

from pathlib import Path

from composetrain.core.composition_rules import FULLGRAPH, REFUSED

ROOT = Path(__file__).resolve().parents[1]

# (role, how the README names it, its column's abbreviation), in the table's order
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
    """The README's table and its notes, in Markdown."""
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


def test_the_readme_table_is_the_composition_rules():
    assert render() in (ROOT / "README.md").read_text(), (
        "regenerate it: PYTHONPATH=src python tests/test_composition_table.py"
    )


def test_every_refused_pair_of_the_table_is_in_the_readme_table():
    """No rule is left out of the table: each (outer, inner) of REFUSED is a pair of its transforms."""
    roles = {role for role, _, _ in TRANSFORMS}
    assert {role for pair in REFUSED for role in pair} <= roles
    assert all(reason(outer, inner) == REFUSED[outer, inner] for outer, inner in REFUSED if outer != FULLGRAPH)


if __name__ == "__main__":
    print(render(), end="")
