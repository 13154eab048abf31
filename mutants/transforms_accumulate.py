"""The planted bugs of src/composetrain/transforms/accumulate.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": "        largest = min(self.n, size) if self.by_size else -(-size // max(min(self.n, size), 1))",
        "replace": (
            "        largest = -(-size // -(-size // self.n)) if self.by_size else -(-size // max(min(self.n, "
            "size), 1))"
        ),
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_forward_size_is_the_largest_batch_the_plain_step_is_called_with",
        ],
        "why": "micro_batch=m's forwards counted as near-equal pieces: 9 samples by 4 said 3, the forwards hold 4",
        "from": "docs2",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": '        self.roles = self.roles | {"accumulate"}',
        "replace": "        pass",
        "tests": [
            "tests/test_composition_rules.py::test_every_order_the_table_refuses_is_refused_when_built",
        ],
        "why": "accumulate(n) applies no role: pipeline(accumulate(n)(step)), refused by the table, is built",
        "from": "docs2",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": "        return self._inner().forward_size(state, largest)",
        "replace": "        return self._inner().forward_size(state, size)",
        "tests": [
            "tests/test_global_batch.py::test_evaluation_reads_batches_no_larger_than_the_training_forward",
            "tests/test_accumulate_micro_batch.py::test_forward_size_says_how_large_the_compositions_forwards_are",
        ],
        "why": "accumulate reports the whole batch as its forward: evaluation reads G/W beside micro-batches of m",
        "from": "adversary32",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": "        largest = min(self.n, size) if self.by_size else -(-size // max(min(self.n, size), 1))",
        "replace": "        largest = min(self.n, size) if self.by_size else -(-size // max(self.n, size))",
        "tests": [
            "tests/test_global_batch.py::test_evaluation_reads_batches_no_larger_than_the_training_forward",
            "tests/test_accumulate_micro_batch.py::test_forward_size_says_how_large_the_compositions_forwards_are",
        ],
        "why": "accumulate(n)'s pieces counted as the batch's samples: evaluation one sample at a time",
        "from": "adversary32",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": '    shown = f"micro_batch={n}" if by_size else f"{n}"',
        "replace": '    shown = f"{n}"',
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_it_prints_as_written_and_compares_by_its_size",
        ],
        "why": "32.mb.9: accumulate(micro_batch=4) prints as accumulate(4), which means something else",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": "        return (self.n, self.by_size, self.own_weight)",
        "replace": "        return (self.n, self.own_weight)",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_it_prints_as_written_and_compares_by_its_size",
        ],
        "why": "32.mb.10: accumulate(micro_batch=2) equal to accumulate(2): a composition compares equal to another",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": "lambda step: _Accumulate(step, m, weight, by_size=True))",
        "replace": "lambda step: _Accumulate(step, m, weight, by_size=False))",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_a_timm_style_loop_sees_the_same_consecutive_chunks",
        ],
        "why": (
            "32.mb.11: the size taken for the count: exact still, but m micro-batches whatever b (memory unbounded)"
        ),
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": "    if n is not None and micro_batch is not None:\n",
        "replace": "    if False:  # micro_batch wins\n",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_n_and_micro_batch_together_are_refused_naming_both",
        ],
        "why": "32.mb.12: n and micro_batch both given: n silently ignored",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": "    if n is None and micro_batch is None:\n",
        "replace": "    if False:\n",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_neither_n_nor_micro_batch_is_refused_naming_both",
        ],
        "why": "32.mb.13: neither given: the message names n alone, not micro_batch, the other way to give it",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": '    if isinstance(n, str) and n == "auto" and micro_batch is not None:\n',
        "replace": "    if False:\n",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_auto_with_a_starting_size_is_refused_with_what_to_use",
        ],
        "why": "32.mb.14: accumulate('auto', micro_batch=m) silently ignores m",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": '        m = check_int(micro_batch, ACCUMULATE, "micro_batch", example="accumulate(micro_batch=8)")',
        "replace": "        m = micro_batch",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_bad_micro_batch_is_a_clear_error",
            "tests/test_conventions.py::test_numeric_and_flag_arguments_follow_one_rule",
        ],
        "why": "32.mb.15: micro_batch unchecked: 0, 2.5 or True fail at the first update, or cut nonsense",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": '    refuses_inside = refused_inside("accumulate")',
        "replace": '    refuses_inside = refused_inside("accumulate_auto")',
        "tests": [
            "tests/test_composition_rules.py::test_a_transforms_refuses_inside_is_its_row_of_the_table",
            "tests/test_composition_rules.py::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step",
        ],
        "why": (
            "31.4.10: accumulate(n) reads accumulate('auto')'s row: it refuses mixed_precision inside it and "
            "wraps accumulate('auto')"
        ),
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": "last_backward=ctx.last_backward and i == last",
        "replace": "last_backward=ctx.last_backward",
        "tests": [
            "tests/test_accumulate.py",
            "tests/test_distributed.py",
        ],
        "why": "every micro-batch's backward syncs gradients (no no_sync)",
        "from": "core",
    },
]
