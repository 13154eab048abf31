"""Planted bugs for issue 32's accumulate(micro_batch=m) (transforms/accumulate.py, the by-size cut in
core/batching.py), each caught by the tests named for it (see tools/mutants.py)."""

T = "tests/test_accumulate_micro_batch.py"
BATCHING = "src/composetrain/core/batching.py"
ACCUMULATE = "src/composetrain/transforms/accumulate.py"
SHORT_LAST = f"{T}::test_the_short_last_micro_batch_is_weighted_by_its_real_size"
TIMM = f"{T}::test_a_timm_style_loop_sees_the_same_consecutive_chunks"
PRINTS = f"{T}::test_it_prints_as_written_and_compares_by_its_size"

MUTANTS = [
    {
        "file": BATCHING,
        "find": "    k = -(-size // n) if by_size else min(n, size)",
        "replace": "    k = size // n if by_size else min(n, size)",
        "tests": [SHORT_LAST],
        "why": "32.mb.1: the floor of b / m instead of its ceiling: the short last micro-batch dropped (b < m: all)",
    },
    {
        "file": BATCHING,
        "find": "        sizes = [min(n, size - i * n) for i in range(k)]",
        "replace": "        sizes = [size / k] * k",
        "tests": [SHORT_LAST],
        "why": "32.mb.2: equal weights instead of unit shares: the short last micro-batch (2 of 10) weighs a third",
    },
    {
        "file": BATCHING,
        "find": "        pieces = [t.split(n) if t.dim() > 0 else (t,) * k for t in leaves]",
        "replace": "        pieces = [t.tensor_split(k) if t.dim() > 0 else (t,) * k for t in leaves]",
        "tests": [TIMM],
        "why": "32.mb.3: near-equal pieces (4, 3, 3) under the by-size weights (4, 4, 2): not the slices a timm loop "
        "takes, and mis-weighted",
    },
    {
        "file": BATCHING,
        "find": "        sizes = [min(n, size - i * n) for i in range(k)]",
        "replace": "        sizes = [n] * (k - 1) + [size % n]",
        "tests": [f"{T}::test_micro_batch_equals_the_plain_step_on_the_whole_batch"],
        "why": "32.mb.4: the last chunk counted as b % m: off by a whole micro-batch (weight 0) when m divides b",
    },
    {
        "file": BATCHING,
        "find": "    if n == 1 and not by_size:\n",
        "replace": "    if n == 1:\n",
        "tests": [f"{T}::test_the_count_follows_the_batch_and_no_micro_batch_exceeds_m"],
        "why": "32.mb.5: micro_batch=1 taken for 'one micro-batch': the whole batch in one pass, memory unbounded",
    },
    {
        "file": BATCHING,
        "find": "    if size is None and by_size:  # one sample, as ``samples`` counts it: nothing to cut\n"
        "        return [batch], [1]\n",
        "replace": "",
        "tests": [f"{T}::test_a_batch_without_a_batch_dimension_is_one_sample_and_stays_whole"],
        "why": "32.mb.6: a batch without a batch dimension (one sample) refused instead of passed whole",
    },
    {
        "file": BATCHING,
        "find": "        return [rebuild(iter([p[i] for p in pieces])) for i in range(k)], sizes",
        "replace": "        return [rebuild(iter([p[k - 1 - i] for p in pieces])) for i in range(k)], sizes[::-1]",
        "tests": [TIMM],
        "why": "32.mb.7: the micro-batches run last first: the same update, not the chunks a timm loop sees in order",
    },
    {
        "file": BATCHING,
        "find": "    if ctx.weight is None:\n        weights = [float(s) for s in sizes]",
        "replace": "    if ctx.weight is None or by_size:\n        weights = [float(s) for s in sizes]",
        "tests": [f"{T}::test_token_weighted_micro_batches_are_exact_with_random_padding"],
        "why": "32.mb.8: the by-size cut forgets weight=: its micro-batches weighed by samples, not by real tokens",
    },
    {
        "file": ACCUMULATE,
        "find": '    shown = f"micro_batch={n}" if by_size else f"{n}"',
        "replace": '    shown = f"{n}"',
        "tests": [PRINTS],
        "why": "32.mb.9: accumulate(micro_batch=4) prints as accumulate(4), which means something else",
    },
    {
        "file": ACCUMULATE,
        "find": "        return (self.n, self.by_size, self.own_weight)",
        "replace": "        return (self.n, self.own_weight)",
        "tests": [PRINTS],
        "why": "32.mb.10: accumulate(micro_batch=2) equal to accumulate(2): a composition compares equal to another",
    },
    {
        "file": ACCUMULATE,
        "find": "lambda step: _Accumulate(step, m, weight, by_size=True))",
        "replace": "lambda step: _Accumulate(step, m, weight, by_size=False))",
        "tests": [TIMM],
        "why": "32.mb.11: the size taken for the count: exact still, but m micro-batches whatever b (memory unbounded)",
    },
    {
        "file": ACCUMULATE,
        "find": "    if n is not None and micro_batch is not None:\n",
        "replace": "    if False:  # micro_batch wins\n",
        "tests": [f"{T}::test_n_and_micro_batch_together_are_refused_naming_both"],
        "why": "32.mb.12: n and micro_batch both given: n silently ignored",
    },
    {
        "file": ACCUMULATE,
        "find": "    if n is None and micro_batch is None:\n",
        "replace": "    if False:\n",
        "tests": [f"{T}::test_neither_n_nor_micro_batch_is_refused_naming_both"],
        "why": "32.mb.13: neither given: the message names n alone, not micro_batch, the other way to give it",
    },
    {
        "file": ACCUMULATE,
        "find": '    if isinstance(n, str) and n == "auto" and micro_batch is not None:\n',
        "replace": "    if False:\n",
        "tests": [f"{T}::test_auto_with_a_starting_size_is_refused_with_what_to_use"],
        "why": "32.mb.14: accumulate('auto', micro_batch=m) silently ignores m",
    },
    {
        "file": ACCUMULATE,
        "find": '        m = check_int(micro_batch, ACCUMULATE, "micro_batch", example="accumulate(micro_batch=8)")',
        "replace": "        m = micro_batch",
        "tests": [
            f"{T}::test_bad_micro_batch_is_a_clear_error",
            "tests/test_conventions.py::test_numeric_and_flag_arguments_follow_one_rule",
        ],
        "why": "32.mb.15: micro_batch unchecked: 0, 2.5 or True fail at the first update, or cut nonsense",
    },
]
