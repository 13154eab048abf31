"""The planted bugs of src/composetrain/core/composition_rules.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": (
            '    ("accumulate_auto", "mixed_precision"): "mixed_precision unscales the gradients after the last '
            'pass, and which "\n'
            '    "pass is last is known only once every pass fitted; use '
            "mixed_precision(accumulate('auto')(step))\",\n"
        ),
        "replace": "",
        "tests": [
            "tests/test_composition_rules.py::test_the_table_holds_exactly_the_orders_that_cannot_be_made_correct",
        ],
        "why": (
            "31.4.1: an entry dropped: accumulate('auto') around mixed_precision is built, and the last pass is "
            "unscaled before the retries know which is last"
        ),
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": (
            '    ("distributed", "sharded"): "a model is either replicated (DDP) or sharded (FSDP), not both; '
            'use ct.sharded alone",\n'
        ),
        "replace": "",
        "tests": [
            "tests/test_composition_rules.py::test_the_table_holds_exactly_the_orders_that_cannot_be_made_correct",
            "tests/test_composition_rules.py::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step",
        ],
        "why": "31.4.2: a pair refused in either order dropped: DDP around FSDP2 and FSDP2 around DDP are built",
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": '    ("data_parallel", "mixed_precision"): "it would unscale',
        "replace": '    ("mixed_precision", "data_parallel"): "it would unscale',
        "tests": [
            "tests/test_composition_rules.py::test_the_table_holds_exactly_the_orders_that_cannot_be_made_correct",
        ],
        "why": (
            "31.4.3: outer and inner swapped: data_parallel unscales each replica's gradients, and the right "
            "order is refused"
        ),
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": "        table[a, b] = table[b, a] = why",
        "replace": "        table[a, b] = why",
        "tests": [
            "tests/test_composition_rules.py::test_the_table_holds_exactly_the_orders_that_cannot_be_made_correct",
        ],
        "why": (
            "31.4.4: the pairs refused in either order refused one way only: distributed(data_parallel(step)) is built"
        ),
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": "    for role, why in _BREAKS_GRAPH.items():",
        "replace": "    for role, why in list(_BREAKS_GRAPH.items())[:-1]:",
        "tests": [
            "tests/test_composition_rules.py::test_the_table_holds_exactly_the_orders_that_cannot_be_made_correct",
        ],
        "why": "31.4.5: the last graph breaker (sharded) left out of the fullgraph rules, in both orders",
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": "{inner: why for (o, inner), why in REFUSED.items() if o == outer}",
        "replace": "{o: why for (o, inner), why in REFUSED.items() if inner == outer}",
        "tests": [
            "tests/test_composition_rules.py::test_a_transforms_refuses_inside_is_its_row_of_the_table",
            "tests/test_composition_rules.py::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step",
        ],
        "why": (
            "31.4.6: the view reads the wrong side (the column): mixed_precision refuses data_parallel inside "
            "it, and data_parallel wraps mixed_precision"
        ),
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": "    for role in sorted(inside & refused.keys()):",
        "replace": "    for role in sorted(inside & refused.keys(), reverse=True):",
        "tests": [
            "tests/test_composition_rules.py::test_a_step_breaking_two_rules_is_refused_for_the_first_by_name_whatever_the_order_inside",
        ],
        "why": "31.4.7: of two rules broken, the message names the last by name: not the documented one",
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": 'table[FULLGRAPH, role] = table[role, FULLGRAPH] = f"{why}, {_FULLGRAPH_FIX}"',
        "replace": "table[FULLGRAPH, role] = table[role, FULLGRAPH] = why",
        "tests": [
            "tests/test_compile.py::test_fullgraph_with_a_transform_that_breaks_the_graph_is_refused_when_built",
        ],
        "why": "31.4.14: the fullgraph refusals lose their fix (use ct.compile(fullgraph=False))",
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": "table[FULLGRAPH, role] = table[role, FULLGRAPH] = ",
        "replace": 'table[FULLGRAPH, role] = table[role, "compile(fullgraph=true)"] = ',
        "tests": [
            "tests/test_compile.py::test_fullgraph_with_a_transform_that_breaks_the_graph_is_refused_when_built",
        ],
        "why": (
            "23.24: the graph breakers name a role nobody has (written once now, in the table): outside "
            "fullgraph checkpoint_activations is not refused"
        ),
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": "table[FULLGRAPH, role] = table[role, FULLGRAPH] = ",
        "replace": 'table[FULLGRAPH, role] = table[role, "compile"] = ',
        "tests": [
            "tests/test_compile.py::test_fullgraph_with_a_transform_that_breaks_the_graph_is_refused_when_built",
        ],
        "why": (
            "23.29: pipeline_split (each graph breaker: one line in the table now) refuses every compile inside it"
        ),
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": "table[FULLGRAPH, role] = table[role, FULLGRAPH] = ",
        "replace": "table[FULLGRAPH, role] = ",
        "tests": [
            "tests/test_compile.py::test_fullgraph_with_a_transform_that_breaks_the_graph_is_refused_when_built",
        ],
        "why": (
            "23.30, 23.32 (one line in the table now): sharded, distributed outside compile(fullgraph=True) are "
            "built, and every rank fails at the first update (torch then hints at Logger)"
        ),
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": '    "sharded": "FSDP2\'s hooks gather',
        "replace": '    "fully_shard": "FSDP2\'s hooks gather',
        "tests": [
            "tests/test_compile.py::test_fullgraph_with_a_transform_that_breaks_the_graph_is_refused_when_built",
        ],
        "why": "23.31: the table names a role no transform has: compile(fullgraph=True) around sharded is built",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": '    ("tensor_parallel", "sharded"): "the model is split first, then FSDP shards each piece',
        "replace": '    ("tensor_parallel", "sharded_"): "the model is split first, then FSDP shards each piece',
        "tests": [
            "tests/test_composition_rules.py::test_the_table_holds_exactly_the_orders_that_cannot_be_made_correct",
            "tests/test_composition_table.py",
        ],
        "why": "tensor_parallel(sharded(...)) accepted: FSDP would shard before the plan splits",
        "from": "meshes",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": (
            '    ("checkpoint_activations", "data_parallel"): "data_parallel\'s replicas are copies of the model '
            'that the chosen "\n'
            '    "submodules are not part of; run one process per device with distributed instead: "\n'
            '    "distributed(checkpoint_activations(modules)(step))",\n'
        ),
        "replace": "",
        "tests": [
            "tests/test_composition_table.py::test_the_order_table_holds_under_the_composition_rules",
        ],
        "why": (
            "a refused pair dropped from the rules: the README's order table still says checkpoint_activations "
            "is not with data_parallel, which now composes"
        ),
        "from": "issue38_docs",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": (
            '    ("sharded", "pipeline_split"): "FSDP2 here shards a model on one device per process; split the '
            'model with "'
        ),
        "replace": (
            '    ("sharded", "accumulate"): "FSDP2 here shards a model on one device per process; split the '
            'model with "'
        ),
        "tests": [
            "tests/test_composition_table.py::test_the_order_table_holds_under_the_composition_rules",
        ],
        "why": (
            "a new refusal (sharded around accumulate(n)) that the order table, which puts them in order, does not say"
        ),
        "from": "issue38_docs",
    },
]
