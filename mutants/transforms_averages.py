"""The planted bugs of src/composetrain/transforms/_averages.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": ("            if rule.device is None:\n                raise\n"),
        "replace": ("            if rule.device is not None:\n                raise\n"),
        "tests": [
            "tests/test_ema_timm.py::test_a_device_this_process_lacks_is_refused_naming_it_before_anything_changes",
        ],
        "why": "adv37: torch's 'no NVIDIA driver' passed on, naming neither ct.ema nor device=",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": 'and theirs.is_floating_point() and kept != mine.get("dtype")',
        "replace": 'and theirs.is_floating_point() and kept == mine.get("dtype")',
        "tests": [
            "tests/test_ema_timm.py::test_a_resume_with_another_average_dtype_names_the_option_it_was_kept_with",
        ],
        "why": "adv37: an average kept with another dtype= told to load a checkpoint of the same model",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": '    then = f"dtype={kept}" if kept is not None',
        "replace": "    then = f\"dtype={mine.get('dtype')}\" if kept is not None",
        "tests": [
            "tests/test_ema_timm.py::test_a_resume_with_another_average_dtype_names_the_option_it_was_kept_with",
        ],
        "why": "adv37: the fix names this run's dtype, not the one the checkpoint's averages were kept with",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": '        saved_settings = saved.get("settings")  # older checkpoints lack them\n',
        "replace": "        saved_settings = None  # older checkpoints lack them\n",
        "tests": [
            "tests/test_ema_timm.py::test_a_resume_with_another_average_dtype_names_the_option_it_was_kept_with",
            "tests/test_ema.py::test_a_resume_with_other_ema_settings_warns_naming_both",
        ],
        "why": "adv37: the checkpoint's settings not read: neither the dtype fix nor the other-settings warning",
        "from": "adv37",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "    if per_tensor:\n",
        "replace": "    if False:\n",
        "tests": [
            "tests/test_ema_timm.py::test_a_float32_average_of_a_bf16_model_is_model_ema_v3s",
        ],
        "why": "37.3: device= averaged with the fused mul and add: not ModelEmaV3(device=)'s cast then lerp",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "    return rule.dtype if rule.dtype is not None and w.is_floating_point() else w.dtype",
        "replace": "    return w.dtype",
        "tests": [
            "tests/test_ema_timm.py::test_ema_model_and_the_evaluation_hold_the_float32_averages",
        ],
        "why": "37.3: dtype= ignored: a bf16 model's average kept in bf16",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": 'or (not floating and rule.integers == "copy"):',
        "replace": 'or (not floating and rule.integers == "average"):',
        "tests": [
            "tests/test_ema_timm.py::test_integer_buffers_are_copied_with_integers_copy_and_averaged_by_default",
        ],
        "why": "37.3: integers='copy' averages num_batches_tracked, the default copies it",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "if (rule.exclude_buffers and k not in self.params)",
        "replace": "if (rule.exclude_buffers and k in self.params)",
        "tests": [
            "tests/test_ema_timm.py::test_a_float32_average_of_a_bf16_model_is_model_ema_v3s",
        ],
        "why": "37.3: exclude_buffers copies the parameters and averages the buffers",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "        torch._foreach_mul_(averages, 1.0 - weight)",
        "replace": "        torch._foreach_mul_(averages, decay)",
        "tests": [
            "tests/test_ema_timm.py::test_a_float64_average_of_a_float32_model_is_model_ema_v3s",
        ],
        "why": "37.3: the old average's weight as decay, not timm's 1 - (1 - decay) (they differ in the last bit)",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "Rule.complete(saved_settings) != Rule.complete(self.settings)",
        "replace": "dict(saved_settings) != self.settings",
        "tests": [
            "tests/test_ema_timm.py::test_a_checkpoint_listing_options_at_their_defaults_resumes_without_a_warning",
        ],
        "why": "37.3: a checkpoint listing options at their defaults warns of other settings that are the same",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": (
            "made = {k: t.to(device=rule.device, dtype=_dtype_for(rule, t), copy=True) for k, t in tensors.items()}"
        ),
        "replace": "made = dict(tensors)",
        "tests": [
            "tests/test_ema.py::test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit",
        ],
        "why": "24.4: the averages alias the live weights: the EMA is the model",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "torch._foreach_lerp_(averages, weights, weight)",
        "replace": "torch._foreach_lerp_(averages, weights, decay)",
        "tests": [
            "tests/test_ema.py::test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit",
        ],
        "why": "24.4: decay taken as the new weights' share",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": ("            torch._foreach_mul_(averages, decay)\n            torch._foreach_add_(averages, scaled)"),
        "replace": (
            "            torch._foreach_mul_(averages, decay)\n"
            "            torch._foreach_add_(averages, weights, alpha=1 - decay)"
        ),
        "tests": [
            "tests/test_ema.py::test_formula_sum_is_torchvisions_exponential_moving_average_bit_for_bit",
        ],
        "why": "24.4: the sum fused (a + alpha * w): not torchvision's rounding",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "    return params, {k: b.detach() for k, b in model.named_buffers()}",
        "replace": "    return params, {}",
        "tests": [
            "tests/test_ema.py::test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit",
        ],
        "why": "24.4: buffers not averaged (AveragedModel's use_buffers=True averages them)",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "        self.n_averaged = n\n",
        "replace": "",
        "tests": [
            "tests/test_ema.py::test_a_checkpoint_resumes_the_average_bit_for_bit_also_before_its_first_update",
        ],
        "why": "24.4: the resumed average forgets how many it averaged: copies the weights again",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": (
            "        with torch.no_grad():\n"
            "            for k, mine in self.tensors.items():\n"
            "                mine.copy_(_laid_out(theirs[k], mine))"
        ),
        "replace": "        self.tensors = dict(theirs)",
        "tests": [
            "tests/test_ema.py::test_a_checkpoint_resumes_the_average_bit_for_bit_also_before_its_first_update",
        ],
        "why": "24.4: the loaded averages alias the checkpoint's tensors (another state's live ones)",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "    if isinstance(like, DTensor) and not isinstance(value, DTensor):",
        "replace": "    if False:",
        "tests": [
            "tests/test_ema_ranks.py",
        ],
        "why": "24.4: whole averages (a checkpoint of another world size) are not sharded as the live averages",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "    return a.shape == w.shape and a.dtype == _dtype_for(rule, w) and type(a) is type(w)",
        "replace": "    return a.shape == w.shape and type(a) is type(w)",
        "tests": [
            "tests/test_ema.py::test_a_model_changed_after_the_ema_began_is_refused_before_the_update",
        ],
        "why": "adversarial: a model cast to another dtype passes the check; the fused update fails after the step",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "                self.tensors[k] = self.tensors[k].to(w.device)",
        "replace": "                pass",
        "tests": [
            "tests/test_ema.py::test_the_averages_follow_their_weights_to_another_device",
        ],
        "why": "adversarial: averages stay behind when the model is placed after they were made (pipeline_split)",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": (
            "        if params is None or live.keys() != mine.keys() or not all(self._alike(mine[k], b) for k, b "
            "in buffers.items()):"
        ),
        "replace": "        if params is None or live.keys() != mine.keys():",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": (
            "29.8: verify sees a buffer the forward cast but does not check it: refused late or averaged across dtypes"
        ),
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": (
            '        return {"averages": dict(self.tensors), "n_averaged": self.n_averaged, "settings": '
            "dict(self.settings)}"
        ),
        "replace": '        return {"averages": dict(self.tensors), "n_averaged": self.n_averaged}',
        "tests": [
            "tests/test_ema.py",
        ],
        "why": "29: the EMA's settings not checkpointed: a resume with another decay is silent",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": (
            "        if isinstance(saved_settings, Mapping) and Rule.complete(saved_settings) != "
            "Rule.complete(self.settings):"
        ),
        "replace": (
            '        if isinstance(saved_settings, Mapping) and saved_settings.get("decay") != self.settings["decay"]:'
        ),
        "tests": [
            "tests/test_ema.py",
        ],
        "why": "29: only the decay compared at a resume: another every, warmup or formula is silent",
        "from": "issue29_atomic",
    },
]
