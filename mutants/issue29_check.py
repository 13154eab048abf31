"""Planted bugs for issue 29 item 13 and its unclear answers (ct.check) and issue 30 items 3, 4, 5, 7 (ct.check,
ct.compile, ct.shifted_tokens), each caught by the tests named for it (see tools/mutants.py)."""

A = "tests/test_check_answers.py::"
HF = "tests/test_hf.py::test_check_judges_the_models_own_float32_loss_at_float32_and_still_names_a_misweighing"
NOT_DETERMINISTIC = A + "test_a_step_drawing_from_its_own_generator_is_said_to_be_not_deterministic"
SMALL = A + "test_a_small_tensors_wrong_update_is_a_difference_beside_a_large_one"
HALF = A + "test_a_model_holding_half_and_single_precision_is_judged_at_the_half"
NEGATIVE = "tests/test_shifted_tokens.py::test_a_negative_index_finds_the_labels_as_indexing_the_batch_does"
TWO_STEPS = "tests/test_compile.py::test_compiled_compositions_of_different_plain_steps_on_one_state_each_run_their_own"
CHECKING = "src/composetrain/checking/__init__.py"
PEELING = "src/composetrain/checking/_peeling.py"
KEY = 'key = (id(step), *(id(options[k]) if k == "backend" else options[k] for k in _COMPILE_OPTIONS))'

MUTANTS = [
    {
        "file": CHECKING,
        "find": "        low = _lowest(low, step)",
        "replace": "        low = _lowest(used, step)",
        "tests": [HF],
        "why": "29.13: the tolerance by the copies' dtype alone: transformers' float32 .loss reported as DIFFERS",
    },
    {
        "file": PEELING,
        "find": "    return gaps, used, coarsest([used, *losses[:2]])",
        "replace": "    return gaps, used, used",
        "tests": [HF],
        "why": "29.13: the loss's dtype never reaches the tolerance",
    },
    {
        "file": "src/composetrain/checking/_result.py",
        "find": 'low = "" if self.lowest in (None, self.dtype) else',
        "replace": 'low = "" if True else',
        "tests": [HF],
        "why": "29.13: the printout hides the lower precision the tolerance followed",
    },
    {
        "file": PEELING,
        "find": "    return max((d for d in dtypes if d.is_floating_point), key=lambda d: torch.finfo(d).eps)",
        "replace": "    return min((d for d in dtypes if d.is_floating_point), key=lambda d: torch.finfo(d).eps)",
        "tests": [HALF],
        "why": "29.13 / 30.5: the finest precision taken for the lowest: half-precision rounding reported",
    },
    {
        "file": PEELING,
        "find": "    return coarsest(floats) if floats else torch.float32",
        "replace": "    return min(floats, key=lambda d: torch.finfo(d).eps) if floats else torch.float32",
        "tests": [HALF],
        "why": "30.5: dtype=None judged at the model's float32 beside its float16 parameters",
    },
    {
        "file": CHECKING,
        "find": "            if not _agree(again, tol):",
        "replace": "            if False:",
        "tests": [NOT_DETERMINISTIC],
        "why": "29: the plain step never checked against itself: a step with its own generator blames accumulate",
    },
    {
        "file": CHECKING,
        "find": "            again = compare(reference, reference, state, batch, dtype, updates)[0]",
        "replace": "            again = gaps",
        "tests": ["tests/test_check.py::test_a_planted_wrong_composition_is_found_and_its_layer_named"],
        "why": "29: the composition's gaps taken for the plain step's own: every difference called non-determinism",
    },
    {
        "file": CHECKING,
        "find": "        if not ok and reason is None:",
        "replace": "        if not ok:",
        "tests": [NOT_DETERMINISTIC],
        "why": "29: a layer named although the plain step differs from itself",
    },
    {
        "file": "src/composetrain/checking/_result.py",
        "find": '            lines.append(f"  {self.reason}")',
        "replace": "            pass",
        "tests": [NOT_DETERMINISTIC],
        "why": "29: the printed result says DIFFERS with no layer and no reason",
    },
    {
        "file": PEELING,
        "find": "            except torch.OutOfMemoryError as e:",
        "replace": "            except torch.OutOfMemoryError if False else ZeroDivisionError as e:",
        "tests": [A + "test_a_batch_the_plain_step_cannot_fit_is_refused_saying_to_check_a_smaller_one"],
        "why": "29: a bare out-of-memory escapes check on a batch only accumulate('auto') can fit",
    },
    {
        "file": CHECKING,
        "find": "    return all(_within(g, rtol, atol) for quantity in gaps[:4] if quantity is not None for g in quantity)",  # noqa: E501
        "replace": "    return all(_within(g._replace(scale=max(h.scale for h in quantity)), rtol, atol) "
        "for quantity in gaps[:4] if quantity is not None for g in quantity)",
        "tests": [SMALL],
        "why": "29: the tolerance relative to the largest tensor overall: a small tensor's flipped update passes",
    },
    {
        "file": CHECKING,
        "find": "        return (math.inf if math.isnan(g.largest) else share), "
        "(math.inf if math.isnan(g.largest) else g.largest)",
        "replace": "        return share, g.largest",
        "tests": [A + "test_a_nan_in_one_tensor_is_what_is_reported_not_a_finite_one_beside_it"],
        "why": "29: NaN compares as nothing: a finite tensor reported where another is NaN",
    },
    {
        "file": CHECKING,
        "find": "    return gap.largest <= atol + rtol * gap.scale",
        "replace": "    return gap.largest < atol + rtol * gap.scale",
        "tests": [A + "test_an_exact_composition_agrees_at_zero_tolerance"],
        "why": "30.4: at rtol=0, atol=0 a bit-exact composition is said to differ",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "            if -len(batch) <= self.key < len(batch):",
        "replace": "            if 0 <= self.key < len(batch):",
        "tests": [NEGATIVE],
        "why": "30.7: shifted_tokens(-1) refused although batch[-1] holds the labels",
    },
    {
        "file": "src/composetrain/core/tokens.py",
        "find": "            if -len(batch) <= self.key < len(batch):",
        "replace": "            if self.key < len(batch):",
        "tests": [NEGATIVE],
        "why": "30.7: a negative index past the batch escapes as Python's bare IndexError",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": KEY,
        "replace": KEY.replace("key = (id(step), ", "key = (0, "),
        "tests": [TWO_STEPS],
        "why": "30.3: compiled wrappers keyed by options alone: a second plain step runs the first's loss",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": KEY,
        "replace": KEY.replace("id(step)", 'id(getattr(step, "__code__", step))'),
        "tests": [TWO_STEPS],
        "why": "30.3: keyed by code object: closures of one factory (another loss weight) share a wrapper",
    },
    {
        "file": "src/composetrain/transforms/compile.py",
        "find": "        found = self.steps.get(key)",
        "replace": "        found = next(iter(self.steps.values()), None)",
        "tests": [TWO_STEPS],
        "why": "30.3: the first compiled wrapper reused for every plain step on the state",
    },
]
