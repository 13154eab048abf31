"""The planted bugs of src/composetrain/checking/__init__.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": ("        restore_rng(rng)\n        changed = own.restore()\n"),
        "replace": "        changed = own.restore()\n",
        "tests": [
            "tests/test_check.py::test_both_sides_draw_the_same_random_numbers_and_the_users_generators_stay_as_they_were",
            "tests/test_check.py::test_the_users_generators_stay_as_they_were_when_the_step_raises_after_drawing",
        ],
        "why": "24.6: the user's random generators left advanced by check's two updates",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    except Exception:  # the model refuses float64",
        "replace": "    except TypeError if False else ZeroDivisionError:  # the model refuses float64",
        "tests": [
            "tests/test_check.py::test_a_model_that_refuses_float64_is_checked_in_its_own_precision",
        ],
        "why": "24.6: the fallback to the model's own precision catches too little: a float32-only model fails check",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "        for i in range(len(layers) - 1, -1, -1):  # innermost first",
        "replace": "        for i in range(len(layers)):  # innermost first",
        "tests": [
            "tests/test_check.py::test_a_planted_wrong_composition_is_found_and_its_layer_named",
        ],
        "why": "24.6: peeled from the outside: the outermost layer blamed for an inner one's bug",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": '    if low is torch.float64 or "mixed_precision" not in step.roles:',
        "replace": "    if True:",
        "tests": [
            "tests/test_check.py::test_mixed_precision_is_checked_in_its_own_precision_with_its_tolerance",
        ],
        "why": "24.6: mixed_precision judged by float32's tolerance: its own rounding reported as a divergence",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    if world > 1 and step.capabilities.syncs_processes:",
        "replace": "    if world > 1 and step.capabilities.places_model:",
        "tests": [
            "tests/test_check.py::test_a_composition_of_several_processes_is_refused_under_a_group_and_the_rest_checked",
        ],
        "why": "24.6: a distributed composition under a group of two checked against a one-process reference",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    return gap.largest <= atol + rtol * gap.scale",
        "replace": "    return not gap.largest > atol + rtol * gap.scale",
        "tests": [
            "tests/test_check.py::test_a_non_finite_update_is_a_difference",
        ],
        "why": "24.6: a NaN difference compares as no difference (nan > worst is False): a NaN update passes",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    if problem or not (math.isfinite(float(value)) and float(value) >= 0):",
        "replace": "    if problem or not math.isfinite(float(value)):",
        "tests": [
            "tests/test_check.py::test_nonsense_tolerances_are_clear_errors",
        ],
        "why": "a-recipes: a negative tolerance accepted: every check fails, a right composition reported wrong",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    problem = isinstance(value, bool) or not isinstance(value, numbers.Real)",
        "replace": "    problem = not isinstance(value, numbers.Real)",
        "tests": [
            "tests/test_check.py::test_nonsense_tolerances_are_clear_errors",
        ],
        "why": "a-recipes: rtol=True taken as 1.0: a 100% tolerance passes anything",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "        low = _lowest(low, step)",
        "replace": "        low = _lowest(used, step)",
        "tests": [
            "tests/test_hf.py::test_check_judges_the_models_own_float32_loss_at_float32_and_still_names_a_misweighing",
        ],
        "why": "29.13: the tolerance by the copies' dtype alone: transformers' float32 .loss reported as DIFFERS",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "            if not _agree(again, tol):",
        "replace": "            if False:",
        "tests": [
            "tests/test_check_answers.py::test_a_step_drawing_from_its_own_generator_is_said_to_be_not_deterministic",
        ],
        "why": "29: the plain step never checked against itself: a step with its own generator blames accumulate",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "            again = compare(reference, reference, state, batch, dtype, updates)[0]",
        "replace": "            again = gaps",
        "tests": [
            "tests/test_check.py::test_a_planted_wrong_composition_is_found_and_its_layer_named",
        ],
        "why": "29: the composition's gaps taken for the plain step's own: every difference called non-determinism",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "        if not ok and reason is None:",
        "replace": "        if not ok:",
        "tests": [
            "tests/test_check_answers.py::test_a_step_drawing_from_its_own_generator_is_said_to_be_not_deterministic",
        ],
        "why": "29: a layer named although the plain step differs from itself",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": (
            "    return all(_within(g, rtol, atol) for quantity in gaps[:4] if quantity is not None for g in quantity)"
        ),
        "replace": (
            "    return all(_within(g._replace(scale=max(h.scale for h in quantity)), rtol, atol) for quantity "
            "in gaps[:4] if quantity is not None for g in quantity)"
        ),
        "tests": [
            "tests/test_check_answers.py::test_a_small_tensors_wrong_update_is_a_difference_beside_a_large_one",
        ],
        "why": "29: the tolerance relative to the largest tensor overall: a small tensor's flipped update passes",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": (
            "        return (math.inf if math.isnan(g.largest) else share), (math.inf if math.isnan(g.largest) "
            "else g.largest)"
        ),
        "replace": "        return share, g.largest",
        "tests": [
            "tests/test_check_answers.py::test_a_nan_in_one_tensor_is_what_is_reported_not_a_finite_one_beside_it",
        ],
        "why": "29: NaN compares as nothing: a finite tensor reported where another is NaN",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    return gap.largest <= atol + rtol * gap.scale",
        "replace": "    return gap.largest < atol + rtol * gap.scale",
        "tests": [
            "tests/test_check_answers.py::test_an_exact_composition_agrees_at_zero_tolerance",
        ],
        "why": "30.4: at rtol=0, atol=0 a bit-exact composition is said to differ",
        "from": "issue29_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "            again = compare(reference, reference, state, batch, dtype, updates)[0]",
        "replace": "            again = compare(reference, reference, state, batch, used, updates)[0]",
        "tests": [
            "tests/test_check_answers.py::test_a_model_of_half_and_single_layers_is_peeled_in_the_precisions_it_was_compared_in",
        ],
        "why": "the plain step against itself on copies cast to the lowest dtype: a bf16/float32 model fails",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "reference_step(layers[i:], plain), state, batch, dtype, updates)[0]",
        "replace": "reference_step(layers[i:], plain), state, batch, used, updates)[0]",
        "tests": [
            "tests/test_check_answers.py::test_a_model_of_half_and_single_layers_is_peeled_in_the_precisions_it_was_compared_in",
        ],
        "why": "each peeled layer on copies cast to the lowest dtype: a bf16/float32 model fails, no layer named",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "            dtype = None\n",
        "replace": "",
        "tests": [
            "tests/test_check_answers.py::test_a_model_of_half_and_single_layers_is_peeled_in_the_precisions_it_was_compared_in",
        ],
        "why": "float64 failed, then the re-comparisons tried float64 again: they fail where the first did",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "auto if isinstance(auto, torch.dtype) else torch.bfloat16",
        "replace": "auto if isinstance(auto, torch.dtype) and auto is not torch.float32 else torch.bfloat16",
        "tests": [
            "tests/test_check.py::test_mixed_precision_in_fp32_is_a_no_op_judged_at_the_models_precision",
        ],
        "why": "mixed_precision('fp32') judged at bf16's 5e-2: a 1% wrong composition passes",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "        updates = gaps[4] is not None  # the peeled layers too",
        "replace": "        updates = False  # the peeled layers too",
        "tests": [
            "tests/test_check_update.py::test_16_bit_models_in_their_own_precision_and_under_autocast_agree",
        ],
        "why": "peeled layers inside mixed_precision skip the comparison: mixed_precision is blamed for the flip",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    if gaps[4] is not None and not all(_within(g, update_rtol, update_atol) for g in gaps[4]):",
        "replace": "    if gaps[4] is not None and not all(_within(g, rtol, atol) for g in gaps[4]):",
        "tests": [
            "tests/test_check_update.py::test_a_sign_flipped_small_update_under_a_float32_loss_is_named",
        ],
        "why": "the update phase judged at the loss's float32 tolerance: the flipped small update passes",
        "from": "issue29_x_check",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    if math.isnan(gap.largest):  # NaN differs from NaN",
        "replace": "    if False:  # NaN differs from NaN",
        "tests": [
            "tests/test_check_answers.py::test_a_plain_update_that_is_not_finite_is_said_to_be_so_not_nondeterministic",
        ],
        "why": "lead's fix: a plain update that is not finite (Adam's eps in float16) called not deterministic",
        "from": "issue29_x_check",
    },
]
