"""The planted bugs of src/composetrain/driver/epoch_ends.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/epoch_ends.py",
        "find": '        how, marked = ("await", " (async def)") if kind == "a coroutine" else ("iterate", "")',
        "replace": '        how, marked = ("await", " (async def)") if kind != "a coroutine" else ("iterate", "")',
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_refused_hook_is_told_why_it_cannot_be_called",
        ],
        "why": "adv37: an async hook told it would not be iterated, a generator that it would not be awaited",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/driver/epoch_ends.py",
        "find": "    elif isinstance(fn, type):\n",
        "replace": "    elif fn is type:\n",
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_refused_hook_is_told_why_it_cannot_be_called",
            "tests/test_run_epoch_ends.py::test_a_hook_that_cannot_be_called_as_fn_state_epoch_is_refused",
        ],
        "why": "adv37: a class accepted as a hook (nn.Linear(state, epoch) binds): ct.run would build one per epoch",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/driver/epoch_ends.py",
        "find": "            if signature is not None:\n",
        "replace": "            if signature is None:\n",
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_refused_hook_is_told_why_it_cannot_be_called",
            "tests/test_run_epoch_ends.py::test_a_hook_that_cannot_be_called_as_fn_state_epoch_is_refused",
        ],
        "why": "adv37: the signature never bound: a hook of three arguments fails in the first epoch's end",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/driver/epoch_ends.py",
        "find": '    moved = [k for k in ("step", "epoch") if getattr(state, k) != kept[k]]',
        "replace": '    moved = [k for k in ("step",) if getattr(state, k) != kept[k]]',
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_hook_that_moves_the_runs_count_or_swaps_what_it_trains_is_refused_at_once",
        ],
        "why": "adv37: a hook's state.end_epoch() (an epoch scheduler stepped twice an epoch) let through",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/driver/epoch_ends.py",
        "find": '_KEPT = ("step", "epoch", "model", "optimizer", "scheduler")',
        "replace": '_KEPT = ("step", "epoch", "model", "optimizer")',
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_hook_that_moves_the_runs_count_or_swaps_what_it_trains_is_refused_at_once",
        ],
        "why": "adv37: a hook swapping the scheduler let through: the checkpoint holds another scheduler's state",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/driver/epoch_ends.py",
        "find": ("    kept = {k: getattr(state, k) for k in _KEPT}\n    fn(state, epoch)\n"),
        "replace": ("    fn(state, epoch)\n    kept = {k: getattr(state, k) for k in _KEPT}\n"),
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_hook_that_moves_the_runs_count_or_swaps_what_it_trains_is_refused_at_once",
        ],
        "why": "adv37: the state read after the hook, not before: nothing it changed is seen",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/driver/epoch_ends.py",
        "find": ("    if metric in groups.get(kind, {}):\n        return float(groups[kind][metric])"),
        "replace": ("    if metric in own:\n        return float(own[metric])"),
        "tests": [
            "tests/test_run_epoch_ends.py::test_the_metric_of_ct_ema_s_weights_can_feed_it",
        ],
        "why": "37.2: 'eval_ema.loss' read from the model's own evaluation",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/driver/epoch_ends.py",
        "find": "    if name is None and scheduler is not None and needs_metric(scheduler):",
        "replace": "    if False:",
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_scheduler_that_needs_a_metric_without_one_is_refused",
        ],
        "why": "37.2: a plateau scheduler without scheduler_metric runs: refused only at the first epoch's end",
        "from": "timm_recipes",
    },
]
