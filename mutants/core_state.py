"""The planted bugs of src/composetrain/core/state.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/state.py",
        "find": "            self.view.agree(problem, LOAD_STATE)\n",
        "replace": ("            if problem is not None:\n                raise problem\n"),
        "tests": [
            "tests/test_meshes_adversary.py::test_a_checkpoint_one_stage_refuses_is_loaded_by_no_stage",
        ],
        "why": "each stage checks only its own part: the stages whose part is fine load while another refuses",
        "from": "adv34_load",
    },
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
    {
        "file": "src/composetrain/core/state.py",
        "find": "scheduler.step(self.epoch + 1) if value is None else scheduler.step(self.epoch + 1, value)",
        "replace": "scheduler.step(self.epoch) if value is None else scheduler.step(self.epoch, value)",
        "tests": [
            "tests/test_timm_schedulers.py::test_any_object_with_step_update_and_step_epoch_is_driven_alike",
        ],
        "why": "37.1: step(epoch) given the epoch that ended, not timm's epoch + 1 (the epochs ended)",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": '            "epoch": self.epoch,\n',
        "replace": "",
        "tests": [
            "tests/test_timm_schedulers.py::test_a_timm_scheduler_resumes_from_a_checkpoint_exactly",
        ],
        "why": "37.1: the epochs ended not checkpointed: a resumed timm scheduler steps from epoch 1 again",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": "else scheduler.step(self.epoch + 1, value)",
        "replace": "else scheduler.step(self.epoch + 1, metric)",
        "tests": [
            "tests/test_timm_schedulers.py::test_a_timm_scheduler_takes_the_metric_as_timms_loop_gives_it",
        ],
        "why": "37.2: the metric passed on as given (a NumPy float in the scheduler's checkpointed state)",
        "from": "timm_recipes",
    },
]
