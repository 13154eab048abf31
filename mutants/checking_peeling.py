"""The planted bugs of src/composetrain/checking/_peeling.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "        restore_rng(rng)  # both draw the same random numbers",
        "replace": "        pass  # both draw the same random numbers",
        "tests": [
            "tests/test_check.py::test_both_sides_draw_the_same_random_numbers_and_the_users_generators_stay_as_they_were",
        ],
        "why": "24.6: the composition draws after the reference: its dropout masks differ, a false alarm",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "        return self._inner().update(state, ctx)",
        "replace": (
            "        done = self._inner().update(state, ctx)\n"
            "        for name, p in state.model.named_parameters():\n"
            '            self.kept[name] = None if p.grad is None else dense(p.grad.detach()).to("cpu", '
            "copy=True)\n"
            "        return done"
        ),
        "tests": [
            "tests/test_check.py::test_the_reference_keeps_the_transforms_that_change_the_update",
        ],
        "why": "24.6: the gradients read after the update phase: clipped, not those the update received",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "    return t.to(torch.complex128) if t.is_complex() else t.double()",
        "replace": "    return t.double()",
        "tests": [
            "tests/test_check.py::test_complex_parameters_are_checked_in_complex128_not_cast_to_real",
        ],
        "why": "a-recipes: the gaps measured on the real parts of complex tensors only",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "        _per_tensor(buffers, ref_buffers) if ref_buffers else None,",
        "replace": "        None,",
        "tests": [
            "tests/test_check.py::test_buffers_a_composition_updates_wrongly_are_a_difference_and_its_layer_named",
        ],
        "why": "a-recipes: buffers not compared: a forward run twice (BatchNorm statistics stepped twice) passes",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "        if not runs and not _finite(out.loss, grads):",
        "replace": "        if False:",
        "tests": [
            "tests/test_check.py::test_a_batch_the_plain_step_itself_cannot_train_on_is_refused_not_blamed_on_a_layer",
        ],
        "why": "a-recipes: a NaN batch makes the plain step NaN too: the innermost layer blamed for the data",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "    return gaps, used, coarsest([used, *losses[:2]])",
        "replace": "    return gaps, used, used",
        "tests": [
            "tests/test_hf.py::test_check_judges_the_models_own_float32_loss_at_float32_and_still_names_a_misweighing",
        ],
        "why": "29.13: the loss's dtype never reaches the tolerance",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "    return max((d for d in dtypes if d.is_floating_point), key=lambda d: torch.finfo(d).eps)",
        "replace": "    return min((d for d in dtypes if d.is_floating_point), key=lambda d: torch.finfo(d).eps)",
        "tests": [
            "tests/test_check_answers.py::test_a_model_holding_half_and_single_precision_is_judged_at_the_half",
        ],
        "why": "29.13 / 30.5: the finest precision taken for the lowest: half-precision rounding reported",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "    return coarsest(floats) if floats else torch.float32",
        "replace": "    return min(floats, key=lambda d: torch.finfo(d).eps) if floats else torch.float32",
        "tests": [
            "tests/test_check_answers.py::test_a_model_holding_half_and_single_precision_is_judged_at_the_half",
        ],
        "why": "30.5: dtype=None judged at the model's float32 beside its float16 parameters",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "            except torch.OutOfMemoryError as e:",
        "replace": "            except torch.OutOfMemoryError if False else ZeroDivisionError as e:",
        "tests": [
            "tests/test_check_answers.py::test_a_batch_the_plain_step_cannot_fit_is_refused_saying_to_check_a_smaller_one",
        ],
        "why": "29: a bare out-of-memory escapes check on a batch only accumulate('auto') can fit",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": '        return f"check: {self.inner!r}"',
        "replace": '        return f"_Probe({self.inner!r})"',
        "tests": [
            "tests/test_check.py::test_an_empty_batch_is_refused_naming_check_not_its_internal_step",
        ],
        "why": "an error of the step inside names check's internal _Probe",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "            if not (update or lower or torch.finfo(low).eps > torch.finfo(used).eps):",
        "replace": "            if not (update or lower):",
        "tests": [
            "tests/test_check_update.py::test_a_sign_flipped_small_update_under_a_float32_loss_is_named",
        ],
        "why": "the float32 loss no longer triggers the update-phase comparison: the flipped small update passes",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "                p.grad = None if g is None else g.to(p.device, p.dtype, copy=True)",
        "replace": "                pass",
        "tests": [
            "tests/test_check_update.py::test_exact_accumulation_of_gpt2s_float32_loss_agrees_on_every_seed_and_a_flip_is_named",
        ],
        "why": "the reference's update phase runs on its own gradients, not the composition's",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "        _per_tensor(params, runs[2][2]) if len(runs) == 3 else None,",
        "replace": "        _per_tensor(params, runs[0][2]) if len(runs) == 3 else None,",
        "tests": [
            "tests/test_check_update.py::test_exact_accumulation_of_gpt2s_float32_loss_agrees_on_every_seed_and_a_flip_is_named",
        ],
        "why": "the update phase compared with the plain step's parameters at float64: GPT-2's float32 loss differs",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": '            lower = "mixed_precision" in step.roles and used is not torch.float64',
        "replace": "            lower = False",
        "tests": [
            "tests/test_check_update.py::test_16_bit_models_in_their_own_precision_and_under_autocast_agree",
        ],
        "why": "an autocast's lower gradients do not trigger the comparison: a flip under bf16 passes",
        "from": "issue29_x_check",
    },
]
