"""The planted bugs of src/composetrain/checking/_copies.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "        model._apply(lambda t: _cast(t, dtype))",
        "replace": "        model.to(dtype)",
        "tests": [
            "tests/test_check.py::test_complex_parameters_are_checked_in_complex128_not_cast_to_real",
        ],
        "why": "a-recipes: Module.to(float64) casts a complex parameter to real: check compares another model",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": '        saved["transforms"] = map_tensors(saved["transforms"], lambda t: _cast(t, dtype))',
        "replace": "        pass",
        "tests": [
            "tests/test_check.py::test_a_state_with_averages_already_is_checked_in_float64",
        ],
        "why": "a-recipes: ct.ema's float32 averages refused by the float64 copy: silently checked in float32",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "                t.grad = grad\n",
        "replace": "",
        "tests": [
            "tests/test_check.py::test_a_tensor_outside_the_model_the_step_closes_over_is_refused",
        ],
        "why": "a-recipes: a changed gradient of the user's reported but left behind",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": '                named.setdefault(id(p), ("an optimizer parameter outside the model", p))',
        "replace": "                pass",
        "tests": [
            "tests/test_check.py::test_a_tensor_outside_the_model_the_step_closes_over_is_refused",
        ],
        "why": "a-recipes: the optimizer's tensors outside the model not watched: a closure over one goes unseen",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "            if not _same(t.detach(), value):",
        "replace": "            if t._version != value._version:",
        "tests": [
            "tests/test_check.py::test_a_step_that_reaches_the_users_own_model_is_refused_and_the_model_restored",
        ],
        "why": "a-recipes: changes found by version counters, which BatchNorm's in-place statistics do not bump",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "    copied = TrainState(model, optimizer, scheduler, scheduler_interval=state.scheduler_interval)",
        "replace": "    copied = TrainState(model, optimizer, scheduler)",
        "tests": [
            "tests/test_check.py::test_a_state_whose_scheduler_steps_per_epoch_is_checked",
        ],
        "why": "a-recipes: the copy steps its scheduler per update: a per-epoch state's scheduler refused (raised)",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "    return t.to_dense() if t.is_sparse else t",
        "replace": "    return t",
        "tests": [
            "tests/test_check.py::test_sparse_gradients_are_compared_and_the_users_left_as_they_were",
        ],
        "why": "a-recipes: a sparse gradient (nn.Embedding(sparse=True)) compared as is: NotImplementedError",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "    except Exception as e:  # a lock, an open file, a generator object held by the model",
        "replace": "    except ZeroDivisionError as e:  # a lock, an open file, a generator object held by the model",
        "tests": [
            "tests/test_check.py::test_what_check_cannot_copy_is_a_clear_error_naming_check_and_nothing_changes",
        ],
        "why": "a model deepcopy refuses fails with its bare error, not naming check",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "    except Exception as e:  # a generator, a tensor inside an autograd graph",
        "replace": "    except ZeroDivisionError as e:  # a generator, a tensor inside an autograd graph",
        "tests": [
            "tests/test_check.py::test_what_check_cannot_copy_is_a_clear_error_naming_check_and_nothing_changes",
        ],
        "why": "a batch deepcopy refuses fails with its bare error, not naming check",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "        if not _equal(_settings(state), self.settings):",
        "replace": "        if False:",
        "tests": [
            "tests/test_check.py::test_a_step_that_changes_the_users_optimizer_settings_or_scheduler_is_refused_and_they_restored",
        ],
        "why": "a step that changes the user's optimizer's lr through a global: changed silently",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "            state.scheduler.load_state_dict(copy.deepcopy(self.scheduled))",
        "replace": "            pass",
        "tests": [
            "tests/test_check.py::test_a_step_that_changes_the_users_optimizer_settings_or_scheduler_is_refused_and_they_restored",
        ],
        "why": "the user's scheduler said to be put back, left stepped",
        "from": "issue29_x_check",
    },
]
