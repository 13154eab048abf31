"""The planted bugs of src/composetrain/transforms/ema.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "            into.to(device=device, dtype=dtype)\n",
        "replace": "            pass\n",
        "tests": [
            "tests/test_ema_timm.py::test_ema_model_and_the_evaluation_hold_the_float32_averages",
        ],
        "why": "37.3: ct.ema_model of float32 averages of a bf16 model refused (its copy left in bf16)",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "if n != before and (n - 1) % self.every == 0:",
        "replace": "if (n - 1) % self.every == 0:",
        "tests": [
            "tests/test_ema.py::test_skipped_updates_are_not_averaged_nor_counted",
        ],
        "why": "24.4: a skipped update is averaged again",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "if n != before and (n - 1) % self.every == 0:",
        "replace": "if n != before and n % self.every == 0:",
        "tests": [
            "tests/test_ema.py::test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit",
        ],
        "why": "24.4: every=k counts from the k-th update, not the first (the recipe's i % k == 0)",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "follow=n <= self.rule.warmup",
        "replace": "follow=n < self.rule.warmup",
        "tests": [
            "tests/test_ema.py::test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit",
        ],
        "why": "24.4: the warmup ends one update early",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": (
            "    try:\n"
            "        yield\n"
            "    finally:\n"
            "        with torch.no_grad():\n"
            "            for k, t in live.items():\n"
            "                t.copy_(kept[k])\n"
            "        for k, b in model.named_buffers():\n"
            "            if k in buffers and b is not buffers[k]:  # the model's own tensor back, not one made "
            "from the average\n"
            '                owner, _, leaf = k.rpartition(".")\n'
            "                setattr(model.get_submodule(owner), leaf, buffers[k])"
        ),
        "replace": "    yield",
        "tests": [
            "tests/test_ema.py::test_ct_run_evaluates_the_model_and_the_average_and_leaves_the_training_untouched",
        ],
        "why": "24.4: the evaluation leaves the EMA weights in the model: training goes on from them",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "        into = copy.deepcopy(state.model)",
        "replace": "        into = state.model",
        "tests": [
            "tests/test_ema.py::test_ema_model_is_an_independent_copy_with_the_averages_or_loads_into_a_module",
        ],
        "why": "24.4: ema_model writes the averages into the training model",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": ("        super().setup(state)\n        self._averages(state)"),
        "replace": ("        self._averages(state)\n        super().setup(state)"),
        "tests": [
            "tests/test_ema_ranks.py::test_ct_run_resumed_mid_epoch_on_two_ranks_ends_with_the_same_average_and_schedule",
        ],
        "why": (
            "24.4: under ct.run the averages are taken before ct.sharded shards the model: whole tensors beside shards"
        ),
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "        if state.step % self.every == 0:  # an applied update would average",
        "replace": "        if False:  # an applied update would average",
        "tests": [
            "tests/test_ema.py::test_a_model_changed_after_the_ema_began_is_refused_before_the_update",
        ],
        "why": "adversarial: no check before the update: a changed model is found after the optimizer stepped",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "    live = averages.matched(model)  # checked before the first copy",
        "replace": "    live = model_tensors(model)  # checked before the first copy",
        "tests": [
            "tests/test_ema.py::test_evaluating_the_average_of_a_changed_model_leaves_the_model_whole",
        ],
        "why": "adversarial: the evaluation's swap fails part-way, leaving some tensors holding the averages",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "    averages = _saved_averages(transforms[KEY]) if KEY in transforms else model_tensors(state.model)",
        "replace": (
            "    averages = transforms[KEY]['averages'] if transforms.get(KEY) is not None else "
            "model_tensors(state.model)"
        ),
        "tests": [
            "tests/test_ema.py::test_ema_model_of_a_crafted_unclaimed_checkpoint_is_refused_clearly",
        ],
        "why": "adversarial: a crafted unclaimed EMA state gives the model's own weights or a bare KeyError",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "        self._agree()\n",
        "replace": "\n",
        "tests": [
            "tests/test_ema_ranks.py::test_ranks_that_average_differently_are_refused_by_ct_run_before_the_first_update",
        ],
        "why": "adversarial: ranks with different decays each keep their own average, silently",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "        configs = differing(self.rule)",
        "replace": '        configs = differing({**self.rule.settings(), "decay": 0.0})',
        "tests": [
            "tests/test_ema_ranks.py::test_ranks_that_average_differently_are_refused_by_ct_run_before_the_first_update",
        ],
        "why": "adversarial: the ranks compare everything but the decay",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "                setattr(model.get_submodule(owner), leaf, buffers[k])",
        "replace": "                pass",
        "tests": [
            "tests/test_ema.py::test_evaluating_the_average_restores_a_buffer_the_forward_reassigned",
        ],
        "why": "adversarial: a buffer the evaluation's forward reassigned keeps the value made from the average",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": (
            "        if t.shape != a.shape or t.dtype != a.dtype:  # copy_ would cast silently, losing the "
            "averages' digits"
        ),
        "replace": "        if t.shape != a.shape:",
        "tests": [
            "tests/test_ema.py",
        ],
        "why": "29: ema_model(into=model.half()) casts the averages silently",
        "from": "issue29_atomic",
    },
]
