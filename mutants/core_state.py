"""The planted bugs of src/composetrain/core/state.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/state.py",
        "find": 'and type(model).__name__ == "OptimizedModule":',
        "replace": 'and type(model).__name__ == "OptimisedModule":',
        "tests": [
            "tests/test_compile.py::test_a_model_wrapped_by_torch_compile_is_refused_with_the_fix",
        ],
        "why": "23.13: torch.compile(model) accepted: its checkpoints carry '_orig_mod.' keys an eager model refuses",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": '            "scheduler_interval": self.scheduler_interval,\n',
        "replace": "",
        "tests": [
            "tests/test_epoch_schedules.py::test_a_wrong_interval_and_a_checkpoint_of_the_other_interval_are_refused",
        ],
        "why": "24.3: the checkpoint does not record the interval: a per-epoch position loads as per-update",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": "        self.scheduler_interval = INTERVALS[INTERVALS.index(scheduler_interval)]",
        "replace": "        self.scheduler_interval = scheduler_interval",
        "tests": [
            "tests/test_ema.py::test_string_likes_are_kept_as_plain_strings_so_checkpoints_load_without_code",
        ],
        "why": "adversarial: a NumPy string kept as given: ct.run's first checkpoint refuses the state",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": "                if k in transforms or isinstance(v, RuntimeState)\n",
        "replace": "                if k in transforms\n",
        "tests": [
            "tests/test_global_batch.py::test_loading_a_checkpoint_keeps_the_live_runtime_state_it_lacks",
        ],
        "why": (
            "a checkpoint of one process drops the live sharding on two: the resumed sharded run refuses its model"
        ),
        "from": "global_batch",
    },
]
