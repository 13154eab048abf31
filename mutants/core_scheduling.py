"""The planted bugs of src/composetrain/core/scheduling.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/scheduling.py",
        "find": "        return math.nan\n",
        "replace": "        return None\n",
        "tests": [
            "tests/test_timm_schedulers.py::test_a_nan_metric_is_an_epoch_without_improvement_as_the_scheduler_takes_it",
            "tests/test_run_epoch_ends.py::test_an_evaluation_of_nan_steps_the_plateau_as_by_hand_and_the_run_goes_on",
        ],
        "why": "adv37: a NaN metric refused again: a run fed by scheduler_metric stops, and so does its resume",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/core/scheduling.py",
        "find": "not isinstance(metric, bool) and math.isnan(metric)",
        "replace": "not isinstance(metric, bool) and math.isinf(metric)",
        "tests": [
            "tests/test_timm_schedulers.py::test_a_nan_metric_is_an_epoch_without_improvement_as_the_scheduler_takes_it",
            "tests/test_run_epoch_ends.py::test_an_evaluation_of_nan_steps_the_plateau_as_by_hand_and_the_run_goes_on",
        ],
        "why": "adv37: the wrong non-finite number let through (an infinity taken as NaN, NaN refused)",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/core/scheduling.py",
        "find": ('        if interval != "epoch":\n            raise TypeError('),
        "replace": ('        if interval != "update":\n            raise TypeError('),
        "tests": [
            "tests/test_epoch_schedules.py::test_reduce_lr_on_plateau_is_refused_per_update_and_driven_per_epoch_with_a_metric",
        ],
        "why": "adversarial: ReduceLROnPlateau refused with the other interval's reason",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/core/scheduling.py",
        "find": "    needed = step_needs(scheduler)\n",
        "replace": "    needed = []\n",
        "tests": [
            "tests/test_scheduler_kinds.py",
        ],
        "why": "29.8: a timm scheduler accepted; its step() raises TypeError after the first optimizer.step()",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/scheduling.py",
        "find": '    return any(isinstance(v, plateau) for v in getattr(scheduler, "__dict__", {}).values())',
        "replace": "    return False",
        "tests": [
            "tests/test_timm_schedulers.py::test_a_plateau_scheduler_without_its_metric_is_refused_changing_nothing",
        ],
        "why": "37.2: timm's PlateauLRScheduler not seen as needing a metric: stepped without one, it never decays",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/core/scheduling.py",
        "find": ('        if interval != "update":\n            raise ValueError('),
        "replace": ('        if interval not in ("update", "epoch"):\n            raise ValueError('),
        "tests": [
            "tests/test_timm_schedulers.py::test_a_scheduler_stepping_both_ways_refuses_an_interval",
        ],
        "why": "37.1: a timm scheduler with scheduler_interval='epoch' accepted: the interval silently ignored",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/core/scheduling.py",
        "find": "    if scheduler is None or not takes_metric(scheduler, kind):",
        "replace": "    if scheduler is None:",
        "tests": [
            "tests/test_timm_schedulers.py::test_a_metric_given_to_a_scheduler_that_takes_none_is_refused",
        ],
        "why": "37.2: a metric given to StepLR's end_epoch is dropped without a word",
        "from": "timm_recipes",
    },
]
