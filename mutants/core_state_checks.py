"""The planted bugs of src/composetrain/core/_state_checks.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": '    if (own and "step" in getattr(obj, "__dict__", {})) or not callable(method):',
        "replace": "    if not callable(method):",
        "tests": [
            "tests/test_scheduler_kinds.py",
        ],
        "why": "29.8: a step set on the scheduler instance is judged by its class's",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": "        return [s for inner in scheduler._schedulers for s in _stepped_next(inner)]\n",
        "replace": "        return [scheduler]\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "a OneCycleLR inside ChainedScheduler is not looked at: its error comes after optimizer.step()",
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": "        return _stepped_next(scheduler._schedulers[i])\n",
        "replace": "        return [scheduler]\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "a OneCycleLR inside SequentialLR is not looked at: its error comes after optimizer.step()",
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": "        upcoming = scheduler.last_epoch + 1  # as SequentialLR.step counts\n",
        "replace": "        upcoming = scheduler.last_epoch\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": (
            "SequentialLR's next scheduler chosen one step early: a cycle restarted at its milestone is judged "
            "by its old count, an update it has steps for refused"
        ),
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": (
            "        if i > 0 and scheduler._milestones[i - 1] == upcoming:  # restarted at its milestone, not "
            "stepped\n"
            "            return []\n"
        ),
        "replace": "",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": (
            "a scheduler SequentialLR restarts at its milestone is judged as stepped: an update it has steps for "
            "is refused"
        ),
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": "        if len(theirs) > len(own) and theirs[: len(own)] == own:",
        "replace": "        if len(theirs) > len(own) and theirs[len(own) :] == own:",
        "tests": [
            "tests/test_core.py",
        ],
        "why": "groups added mid-run (add_param_group in a hook) are not told apart: the refusal names only sizes",
        "from": "stop43",
    },
]
