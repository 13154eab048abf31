"""The planted bugs of src/composetrain/core/steps.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/steps.py",
        "find": "call = self.step if ctx.call_step is None else ctx.call_step(self.step)",
        "replace": "call = self.step",
        "tests": [
            "tests/test_compile.py::test_compiled_composition_equals_eager",
        ],
        "why": "23.2: the innermost pass ignores the channel: the plain step is never compiled",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": 'if scheduler is not None and (kind == "both" or state.scheduler_interval == "update"):',
        "replace": "if scheduler is not None:",
        "tests": [
            "tests/test_epoch_schedules.py::test_the_train_step_leaves_an_epoch_scheduler_alone_and_end_epoch_steps_it_once",
        ],
        "why": "24.3: the TrainStep steps a per-epoch scheduler per update too",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": 'if isinstance(loss, Mapping) and isinstance(loss.get("loss"), torch.Tensor):',
        "replace": 'if isinstance(out, Mapping) and isinstance(out.get("loss"), torch.Tensor):',
        "tests": [
            "tests/test_hf.py::test_a_step_returning_the_model_output_is_told_to_return_its_loss",
        ],
        "why": "25.8: (ModelOutput, metrics) gets the generic message, not the one naming .loss",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": "if isinstance(out, tuple) and len(out) >= 2 and all(",
        "replace": "if isinstance(out, tuple) and len(out) > 2 and all(",
        "tests": [
            "tests/test_hf.py::test_a_step_returning_the_models_tuple_output_is_told_to_return_its_first_item",
            "tests/test_core.py::test_a_step_returning_loss_and_a_tensor_is_told_metrics_go_in_a_mapping",
        ],
        "why": "25.17: (loss, logits) taken for (loss, metrics): the logits blamed as metrics",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": "all(isinstance(v, torch.Tensor) for v in out[:2])",
        "replace": "isinstance(out[0], torch.Tensor)",
        "tests": [
            "tests/test_core.py::test_bad_step_outputs_are_clear_errors_and_change_nothing",
        ],
        "why": "25.18: every (loss, ...) tuple taken for a model's output: (loss, [1.0]) told to return out[0]",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": "        if isinstance(loss, Mapping):  # a ModelOutput",
        "replace": "        if type(loss) is dict:  # a ModelOutput",
        "tests": [
            "tests/test_hf.py::test_a_model_output_without_a_loss_is_told_to_pass_labels",
        ],
        "why": "25.19: a ModelOutput (an OrderedDict subclass) without loss not recognised as a mapping",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": 'named = metric_names(metrics, TRAIN_FIELDS, "the step", who)  # who formatted only for a message',
        "replace": "named = metrics",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: metric names unchecked in the pass: ct.run refuses them only after the update",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": "            if value.is_complex():  # a log record's float() would keep the real part alone\n",
        "replace": "            if False:\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: a complex metric passes the step, refused by ct.run after the update",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": (
            "            except BaseException as e:  # after optimizer.step(): the parameters moved, state.step "
            "did not\n"
            "                state.unusable = ("
        ),
        "replace": (
            "            except BaseException as e:  # after optimizer.step(): the parameters moved, state.step "
            "did not\n"
            "                _ = ("
        ),
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "a scheduler that fails after optimizer.step() leaves a half-updated state that trains on silently",
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": '    if names == getattr(who, "checked_names", None) and all(type(k) is str for k in names):\n',
        "replace": '    if names == getattr(who, "checked_names", None):\n',
        "tests": [
            "tests/test_metric_names.py::test_names_that_change_after_passing_are_checked_again_in_the_pass_that_returns_them",
        ],
        "why": "names taken as checked by equality alone: a str subclass claiming to equal them skips the rule",
        "from": "observability_speed",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": '    if names == getattr(who, "checked_names", None) and all(type(k) is str for k in names):\n',
        "replace": '    if getattr(who, "checked_names", None) is not None:\n',
        "tests": [
            "tests/test_metric_names.py::test_names_that_change_after_passing_are_checked_again_in_the_pass_that_returns_them",
        ],
        "why": "the names checked once for the run: a reserved or non-str name returned later is logged over a field",
        "from": "observability_speed",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": "        if isinstance(who, _Lifted) and all(type(k) is str for k in names):",
        "replace": "        if isinstance(who, _Lifted):",
        "tests": [
            "tests/test_metric_names.py::test_names_that_change_after_passing_are_checked_again_in_the_pass_that_returns_them",
        ],
        "why": "a subclass's names kept as checked: the next pass's comparison runs its __eq__ and skips the rule",
        "from": "observability_speed",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": 'scheduler.step_update(state.step + 1) if kind == "both" else scheduler.step()',
        "replace": 'scheduler.step_update(state.step) if kind == "both" else scheduler.step()',
        "tests": [
            "tests/test_timm_schedulers.py::test_any_object_with_step_update_and_step_epoch_is_driven_alike",
        ],
        "why": "37.1: step_update told the updates before this one (timm's num_updates is counted after it)",
        "from": "timm_recipes",
    },
]
