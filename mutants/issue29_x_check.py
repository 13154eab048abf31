"""Planted bugs for the x-check adversary's fixes to ct.check (issue 29 follow-up), each caught by the tests
named for it (see tools/mutants.py)."""

A = "tests/test_check_answers.py::test_a_model_of_half_and_single_layers_is_peeled_in_the_precisions_it_was_compared_in"
FP32 = "tests/test_check.py::test_mixed_precision_in_fp32_is_a_no_op_judged_at_the_models_precision"
COPY = "tests/test_check.py::test_what_check_cannot_copy_is_a_clear_error_naming_check_and_nothing_changes"
H = "tests/test_check.py::"
USERS = H + "test_a_step_that_changes_the_users_optimizer_settings_or_scheduler_is_refused_and_they_restored"
EMPTY = "tests/test_check.py::test_an_empty_batch_is_refused_naming_check_not_its_internal_step"
CHECKING = "src/composetrain/checking/__init__.py"
COPIES = "src/composetrain/checking/_copies.py"
PEELING = "src/composetrain/checking/_peeling.py"
FLIP = "tests/test_check_update.py::test_a_sign_flipped_small_update_under_a_float32_loss_is_named"
HF_FLIP = (
    "tests/test_check_update.py::test_exact_accumulation_of_gpt2s_float32_loss_agrees_on_every_seed_and_a_flip_is_named"
)
AUTOCAST = "tests/test_check_update.py::test_16_bit_models_in_their_own_precision_and_under_autocast_agree"

MUTANTS = [
    {
        "file": CHECKING,
        "find": "            again = compare(reference, reference, state, batch, dtype, updates)[0]",
        "replace": "            again = compare(reference, reference, state, batch, used, updates)[0]",
        "tests": [A],
        "why": "the plain step against itself on copies cast to the lowest dtype: a bf16/float32 model fails",
    },
    {
        "file": CHECKING,
        "find": "reference_step(layers[i:], plain), state, batch, dtype, updates)[0]",
        "replace": "reference_step(layers[i:], plain), state, batch, used, updates)[0]",
        "tests": [A],
        "why": "each peeled layer on copies cast to the lowest dtype: a bf16/float32 model fails, no layer named",
    },
    {
        "file": CHECKING,
        "find": "            dtype = None\n",
        "replace": "",
        "tests": [A],
        "why": "float64 failed, then the re-comparisons tried float64 again: they fail where the first did",
    },
    {
        "file": CHECKING,
        "find": "auto if isinstance(auto, torch.dtype) else torch.bfloat16",
        "replace": "auto if isinstance(auto, torch.dtype) and auto is not torch.float32 else torch.bfloat16",
        "tests": [FP32],
        "why": "mixed_precision('fp32') judged at bf16's 5e-2: a 1% wrong composition passes",
    },
    {
        "file": COPIES,
        "find": "    except Exception as e:  # a lock, an open file, a generator object held by the model",
        "replace": "    except ZeroDivisionError as e:  # a lock, an open file, a generator object held by the model",
        "tests": [COPY],
        "why": "a model deepcopy refuses fails with its bare error, not naming check",
    },
    {
        "file": COPIES,
        "find": "    except Exception as e:  # a generator, a tensor inside an autograd graph",
        "replace": "    except ZeroDivisionError as e:  # a generator, a tensor inside an autograd graph",
        "tests": [COPY],
        "why": "a batch deepcopy refuses fails with its bare error, not naming check",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": '        return f"check: {self.inner!r}"',
        "replace": '        return f"_Probe({self.inner!r})"',
        "tests": [EMPTY],
        "why": "an error of the step inside names check's internal _Probe",
    },
    {
        "file": COPIES,
        "find": "        if not _equal(_settings(state), self.settings):",
        "replace": "        if False:",
        "tests": [USERS],
        "why": "a step that changes the user's optimizer's lr through a global: changed silently",
    },
    {
        "file": COPIES,
        "find": "            state.scheduler.load_state_dict(copy.deepcopy(self.scheduled))",
        "replace": "            pass",
        "tests": [USERS],
        "why": "the user's scheduler said to be put back, left stepped",
    },
    # the g-check-update fix: the update phase given the composition's own gradients, at the copies' precision
    {
        "file": PEELING,
        "find": "            if not (update or lower or torch.finfo(low).eps > torch.finfo(used).eps):",
        "replace": "            if not (update or lower):",
        "tests": [FLIP],
        "why": "the float32 loss no longer triggers the update-phase comparison: the flipped small update passes",
    },
    {
        "file": PEELING,
        "find": "                p.grad = None if g is None else g.to(p.device, p.dtype, copy=True)",
        "replace": "                pass",
        "tests": [HF_FLIP],
        "why": "the reference's update phase runs on its own gradients, not the composition's",
    },
    {
        "file": PEELING,
        "find": "        _per_tensor(params, runs[2][2]) if len(runs) == 3 else None,",
        "replace": "        _per_tensor(params, runs[0][2]) if len(runs) == 3 else None,",
        "tests": [HF_FLIP],
        "why": "the update phase compared with the plain step's parameters at float64: GPT-2's float32 loss differs",
    },
    {
        "file": CHECKING,
        "find": "        updates = gaps[4] is not None  # the peeled layers too",
        "replace": "        updates = False  # the peeled layers too",
        "tests": [AUTOCAST],
        "why": "peeled layers inside mixed_precision skip the comparison: mixed_precision is blamed for the flip",
    },
    {
        "file": CHECKING,
        "find": "    if gaps[4] is not None and not all(_within(g, update_rtol, update_atol) for g in gaps[4]):",
        "replace": "    if gaps[4] is not None and not all(_within(g, rtol, atol) for g in gaps[4]):",
        "tests": [FLIP],
        "why": "the update phase judged at the loss's float32 tolerance: the flipped small update passes",
    },
    {
        "file": PEELING,
        "find": '            lower = "mixed_precision" in step.roles and used is not torch.float64',
        "replace": "            lower = False",
        "tests": [AUTOCAST],
        "why": "an autocast's lower gradients do not trigger the comparison: a flip under bf16 passes",
    },
    {
        "file": "src/composetrain/checking/_result.py",
        "find": 'lines.append(f"  update phase, given the same gradients: {self.update!r}',
        "replace": 'lines.append(f"  {self.update!r}',
        "tests": [FLIP],
        "why": "the printout hides the update-phase gap that made check differ",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    if math.isnan(gap.largest):  # NaN differs from NaN",
        "replace": "    if False:  # NaN differs from NaN",
        "tests": [
            "tests/test_check_answers.py::test_a_plain_update_that_is_not_finite_is_said_to_be_so_not_nondeterministic"
        ],
        "why": "lead's fix: a plain update that is not finite (Adam's eps in float16) called not deterministic",
    },
]
