"""Planted bugs for issue 31, item 4 (the composition rules as one table, core/composition_rules.py, and what reads
it), each caught by the tests named for it (see tools/mutants.py)."""

C = "tests/test_composition_rules.py"
RULES = "src/composetrain/core/composition_rules.py"
TABLE = f"{C}::test_the_table_holds_exactly_the_orders_that_cannot_be_made_correct"
ROW = f"{C}::test_a_transforms_refuses_inside_is_its_row_of_the_table"
WALK = f"{C}::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step"

MUTANTS = [
    {
        "file": RULES,
        "find": '    ("accumulate_auto", "mixed_precision"): "mixed_precision unscales the gradients after the '
        'last pass, and which "\n    "pass is last is known only once every pass fitted; use '
        "mixed_precision(accumulate('auto')(step))\",\n",
        "replace": "",
        "tests": [TABLE],
        "why": "31.4.1: an entry dropped: accumulate('auto') around mixed_precision is "
        "built, and the last pass is unscaled before the retries know which is last",
    },
    {
        "file": RULES,
        "find": '    ("distributed", "sharded"): "a model is either replicated (DDP) or sharded (FSDP), not both; use '
        'ct.sharded alone",\n',
        "replace": "",
        "tests": [TABLE, WALK],
        "why": "31.4.2: a pair refused in either order dropped: DDP around FSDP2 and FSDP2 around DDP are built",
    },
    {
        "file": RULES,
        "find": '    ("data_parallel", "mixed_precision"): "it would unscale',
        "replace": '    ("mixed_precision", "data_parallel"): "it would unscale',
        "tests": [TABLE],
        "why": "31.4.3: outer and inner swapped: data_parallel unscales each replica's gradients, and the right order "
        "is refused",
    },
    {
        "file": RULES,
        "find": "        table[a, b] = table[b, a] = why",
        "replace": "        table[a, b] = why",
        "tests": [TABLE],
        "why": "31.4.4: the pairs refused in either order refused one way only: distributed(data_parallel(step)) "
        "is built",
    },
    {
        "file": RULES,
        "find": "    for role, why in _BREAKS_GRAPH.items():",
        "replace": "    for role, why in list(_BREAKS_GRAPH.items())[:-1]:",
        "tests": [TABLE],
        "why": "31.4.5: the last graph breaker (sharded) left out of the fullgraph rules, in both orders",
    },
    {
        "file": RULES,
        "find": "{inner: why for (o, inner), why in REFUSED.items() if o == outer}",
        "replace": "{o: why for (o, inner), why in REFUSED.items() if inner == outer}",
        "tests": [ROW, WALK],
        "why": "31.4.6: the view reads the wrong side (the column): mixed_precision refuses data_parallel inside it, "
        "and data_parallel wraps mixed_precision",
    },
    {
        "file": RULES,
        "find": "    for role in sorted(inside & refused.keys()):",
        "replace": "    for role in sorted(inside & refused.keys(), reverse=True):",
        "tests": [f"{C}::test_a_step_breaking_two_rules_is_refused_for_the_first_by_name_whatever_the_order_inside"],
        "why": "31.4.7: of two rules broken, the message names the last by name: not the documented one",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "        check_inside(self._label(), self.refuses_inside, inside)",
        "replace": "        check_inside(self._label(), self.refuses_inside, {getattr(inner, 'role', None)})",
        "tests": [WALK],
        "why": "31.4.8: only the step right inside is checked: data_parallel(ema(mixed_precision(step))) is built",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "        check_inside(self._label(), self.refuses_inside, inside)",
        "replace": "        check_inside(self._label(), inner.refuses_inside if inner is not None else {}, inside)",
        "tests": [WALK],
        "why": "31.4.9: the rules read from the inner step's row, not the outer's: the refused orders are built and "
        "the right ones refused",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": '    refuses_inside = refused_inside("accumulate")',
        "replace": '    refuses_inside = refused_inside("accumulate_auto")',
        "tests": [ROW, WALK],
        "why": "31.4.10: accumulate(n) reads accumulate('auto')'s row: it refuses mixed_precision inside it and "
        "wraps accumulate('auto')",
    },
    {
        "file": "src/composetrain/transforms/data_parallel.py",
        "find": "    refuses_inside = refused_inside(role)",
        "replace": '    refuses_inside = refused_inside("distributed")',
        "tests": [ROW, WALK],
        "why": "31.4.11: data_parallel reads distributed's row: it wraps mixed_precision (unscaling each replica)",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "            check_inside(label, refused_inside(FULLGRAPH), inner.roles)",
        "replace": "            check_inside(label, refused_inside(self.role), inner.roles)",
        "tests": [WALK],
        "why": "31.4.12: a fullgraph compile checked with compile's (empty) row: it wraps distributed, and fails at "
        "the first update",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": '        if options["fullgraph"]:  # before the check of the role',
        "replace": '        if options["cache"]:  # before the check of the role',
        "tests": [WALK],
        "why": "31.4.13: every compile (cache=True by default) refuses the graph breakers inside it",
    },
    {
        "file": RULES,
        "find": 'table[FULLGRAPH, role] = table[role, FULLGRAPH] = f"{why}, {_FULLGRAPH_FIX}"',
        "replace": "table[FULLGRAPH, role] = table[role, FULLGRAPH] = why",
        "tests": ["tests/test_compile.py::test_fullgraph_with_a_transform_that_breaks_the_graph_is_refused_when_built"],
        "why": "31.4.14: the fullgraph refusals lose their fix (use ct.compile(fullgraph=False))",
    },
    {
        "file": "src/composetrain/transforms/pipeline.py",
        "find": "    refuses_inside = refused_inside(role)",
        "replace": '    refuses_inside = {**refused_inside(role), "ema": "planted"}',
        "tests": [WALK],
        "why": "31.4.15: a refusal added outside the table (a transform's own dict): pipeline_split(ema(step)) "
        "is refused",
    },
]
