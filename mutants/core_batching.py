"""The planted bugs of src/composetrain/core/batching.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/batching.py",
        "find": "    k = -(-size // n) if by_size else min(n, size)",
        "replace": "    k = size // n if by_size else min(n, size)",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_the_short_last_micro_batch_is_weighted_by_its_real_size",
        ],
        "why": "32.mb.1: the floor of b / m instead of its ceiling: the short last micro-batch dropped (b < m: all)",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/core/batching.py",
        "find": "        sizes = [min(n, size - i * n) for i in range(k)]",
        "replace": "        sizes = [size / k] * k",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_the_short_last_micro_batch_is_weighted_by_its_real_size",
        ],
        "why": "32.mb.2: equal weights instead of unit shares: the short last micro-batch (2 of 10) weighs a third",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/core/batching.py",
        "find": "        pieces = [t.split(n) if t.dim() > 0 else (t,) * k for t in leaves]",
        "replace": "        pieces = [t.tensor_split(k) if t.dim() > 0 else (t,) * k for t in leaves]",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_a_timm_style_loop_sees_the_same_consecutive_chunks",
        ],
        "why": (
            "32.mb.3: near-equal pieces (4, 3, 3) under the by-size weights (4, 4, 2): not the slices a timm "
            "loop takes, and mis-weighted"
        ),
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/core/batching.py",
        "find": "        sizes = [min(n, size - i * n) for i in range(k)]",
        "replace": "        sizes = [n] * (k - 1) + [size % n]",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_micro_batch_equals_the_plain_step_on_the_whole_batch",
        ],
        "why": "32.mb.4: the last chunk counted as b % m: off by a whole micro-batch (weight 0) when m divides b",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/core/batching.py",
        "find": "    if n == 1 and not by_size:\n",
        "replace": "    if n == 1:\n",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_the_count_follows_the_batch_and_no_micro_batch_exceeds_m",
        ],
        "why": "32.mb.5: micro_batch=1 taken for 'one micro-batch': the whole batch in one pass, memory unbounded",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/core/batching.py",
        "find": (
            "    if size is None and by_size:  # one sample, as ``samples`` counts it: nothing to cut\n"
            "        return [batch], [1]\n"
        ),
        "replace": "",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_a_batch_without_a_batch_dimension_is_one_sample_and_stays_whole",
        ],
        "why": "32.mb.6: a batch without a batch dimension (one sample) refused instead of passed whole",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/core/batching.py",
        "find": "        return [rebuild(iter([p[i] for p in pieces])) for i in range(k)], sizes",
        "replace": "        return [rebuild(iter([p[k - 1 - i] for p in pieces])) for i in range(k)], sizes[::-1]",
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_a_timm_style_loop_sees_the_same_consecutive_chunks",
        ],
        "why": "32.mb.7: the micro-batches run last first: the same update, not the chunks a timm loop sees in order",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/core/batching.py",
        "find": ("    if ctx.weight is None:\n        weights = [float(s) for s in sizes]"),
        "replace": ("    if ctx.weight is None or by_size:\n        weights = [float(s) for s in sizes]"),
        "tests": [
            "tests/test_accumulate_micro_batch.py::test_token_weighted_micro_batches_are_exact_with_random_padding",
        ],
        "why": "32.mb.8: the by-size cut forgets weight=: its micro-batches weighed by samples, not by real tokens",
        "from": "accumulate_micro_batch",
    },
    {
        "file": "src/composetrain/core/batching.py",
        "find": "[size // k + (i < size % k) for i in range(k)]",
        "replace": "[size // k + (i <= size % k) for i in range(k)]",
        "tests": [
            "tests/test_batching.py",
        ],
        "why": "uneven split: the pieces' sizes off by one",
        "from": "core",
    },
]
