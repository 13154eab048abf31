# ruff: noqa: E501
"""Planted bugs for issue 24 items 3 and 4 (epoch schedules, ct.ema), each caught by the tests named."""

EMA = "tests/test_ema.py"
EPOCHS = "tests/test_epoch_schedules.py"
ADV = "tests/test_ema_adversarial.py"

MUTANTS = [
    {
        "file": "src/composetrain/core/steps.py",
        "find": 'if state.scheduler is not None and state.scheduler_interval == "update":  # "epoch": state.end_epoch()',
        "replace": "if state.scheduler is not None:",
        "tests": [f"{EPOCHS}::test_the_train_step_leaves_an_epoch_scheduler_alone_and_end_epoch_steps_it_once"],
        "why": "24.3: the TrainStep steps a per-epoch scheduler per update too",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "                    state.end_epoch()\n",
        "replace": "",
        "tests": [f"{EPOCHS}::test_ct_run_steps_the_recipe_schedule_per_epoch_and_uses_its_rates_exactly"],
        "why": "24.3: ct.run never steps a per-epoch scheduler",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "                    state.end_epoch()\n                    at.next_epoch()",
        "replace": "                    at.next_epoch()\n                if due.save or stopping:\n                    state.end_epoch()",
        "tests": [f"{EPOCHS}::test_a_resume_steps_the_epoch_scheduler_neither_twice_nor_never"],
        "why": "24.3: stepped with each save, not each epoch end: twice per epoch with checkpoint_every, at a stop too",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": '            "scheduler_interval": self.scheduler_interval,\n',
        "replace": "",
        "tests": [f"{EPOCHS}::test_a_wrong_interval_and_a_checkpoint_of_the_other_interval_are_refused"],
        "why": "24.3: the checkpoint does not record the interval: a per-epoch position loads as per-update",
    },
    {
        "file": "src/composetrain/core/schedules.py",
        "find": "if found is None or steps <= 2 * found[0]:",
        "replace": "if found is None or steps <= 2 * found[0] * 10:",
        "tests": [f"{EPOCHS}::test_a_schedule_built_in_epochs_but_stepped_per_update_is_warned_about_with_the_fix"],
        "why": "24.3: the horizon check too lenient to see a schedule built in epochs stepped per update",
    },
    {
        "file": "src/composetrain/core/schedules.py",
        "find": "        return start + tail[0], f",
        "replace": "        return tail[0], f",
        "tests": [f"{EPOCHS}::test_horizons"],
        "why": "24.3: a SequentialLR's horizon forgets the milestones before its last schedule",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "updates // schedule.per_epoch if epoch else updates,",
        "replace": "updates,",
        "tests": [f"{EPOCHS}::test_ct_run_steps_the_recipe_schedule_per_epoch_and_uses_its_rates_exactly"],
        "why": "24.3: a per-epoch scheduler's steps counted in updates: a right schedule is warned about",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "if n != before and (n - 1) % self.every == 0:",
        "replace": "if (n - 1) % self.every == 0:",
        "tests": [f"{EMA}::test_skipped_updates_are_not_averaged_nor_counted"],
        "why": "24.4: a skipped update is averaged again",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "if n != before and (n - 1) % self.every == 0:",
        "replace": "if n != before and n % self.every == 0:",
        "tests": [f"{EMA}::test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit"],
        "why": "24.4: every=k counts from the k-th update, not the first (the recipe's i % k == 0)",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "follow=n <= self.warmup",
        "replace": "follow=n < self.warmup",
        "tests": [f"{EMA}::test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit"],
        "why": "24.4: the warmup ends one update early",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "return cls({k: t.clone() for k, t in model_tensors(model).items()})",
        "replace": "return cls(dict(model_tensors(model)))",
        "tests": [f"{EMA}::test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit"],
        "why": "24.4: the averages alias the live weights: the EMA is the model",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "torch._foreach_lerp_(averages, weights, 1 - decay)",
        "replace": "torch._foreach_lerp_(averages, weights, decay)",
        "tests": [f"{EMA}::test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit"],
        "why": "24.4: decay taken as the new weights' share",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "                    torch._foreach_mul_(averages, decay)\n                    torch._foreach_add_(averages, scaled)",
        "replace": "                    torch._foreach_mul_(averages, decay)\n                    torch._foreach_add_(averages, weights, alpha=1 - decay)",
        "tests": [f"{EMA}::test_formula_sum_is_torchvisions_exponential_moving_average_bit_for_bit"],
        "why": "24.4: the sum fused (a + alpha * w): not torchvision's rounding",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "found.update((k, b.detach()) for k, b in model.named_buffers())",
        "replace": "pass",
        "tests": [f"{EMA}::test_ema_is_averaged_model_with_get_ema_multi_avg_fn_bit_for_bit"],
        "why": "24.4: buffers not averaged (AveragedModel's use_buffers=True averages them)",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "        self.n_averaged = n\n",
        "replace": "",
        "tests": [f"{EMA}::test_a_checkpoint_resumes_the_average_bit_for_bit_also_before_its_first_update"],
        "why": "24.4: the resumed average forgets how many it averaged: copies the weights again",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "        with torch.no_grad():\n            for k, mine in self.tensors.items():\n                mine.copy_(_laid_out(theirs[k], mine))",
        "replace": "        self.tensors = dict(theirs)",
        "tests": [f"{EMA}::test_a_checkpoint_resumes_the_average_bit_for_bit_also_before_its_first_update"],
        "why": "24.4: the loaded averages alias the checkpoint's tensors (another state's live ones)",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "    try:\n        yield\n    finally:\n        with torch.no_grad():\n            for k, t in live.items():\n                t.copy_(kept[k])",
        "replace": "    yield",
        "tests": [f"{EMA}::test_ct_run_evaluates_the_model_and_the_average_and_leaves_the_training_untouched"],
        "why": "24.4: the evaluation leaves the EMA weights in the model: training goes on from them",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "        into = copy.deepcopy(state.model)",
        "replace": "        into = state.model",
        "tests": [f"{EMA}::test_ema_model_is_an_independent_copy_with_the_averages_or_loads_into_a_module"],
        "why": "24.4: ema_model writes the averages into the training model",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "    if isinstance(like, DTensor) and not isinstance(value, DTensor):",
        "replace": "    if False:",
        "tests": ["tests/test_ema_ranks.py"],
        "why": "24.4: whole averages (a checkpoint of another world size) are not sharded as the live averages",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "        super().setup(state)\n        state.transform_state(KEY, lambda: Averages.of(state.model))",
        "replace": "        state.transform_state(KEY, lambda: Averages.of(state.model))\n        super().setup(state)",
        "tests": [
            "tests/test_ema_ranks.py::test_ct_run_resumed_mid_epoch_on_two_ranks_ends_with_the_same_average_and_schedule"
        ],
        "why": "24.4: under ct.run the averages are taken before ct.sharded shards the model: whole tensors beside shards",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            with weights:\n                entry[f"eval_{kind}"] = self.evaluator(self.state.model)',
        "replace": '            entry[f"eval_{kind}"] = self.evaluator(self.state.model)',
        "tests": [f"{EMA}::test_ct_run_evaluates_the_model_and_the_average_and_leaves_the_training_untouched"],
        "why": "24.4: eval_ema evaluates the model's own weights",
    },
    # -- adversarial (a-ema): the fixes of the hostile pass, each undone or bent
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "        if state.step % self.every == 0:  # an applied update would average",
        "replace": "        if False:  # an applied update would average",
        "tests": [f"{ADV}::test_a_model_changed_after_the_ema_began_is_refused_before_the_update"],
        "why": "adversarial: no check before the update: a changed model is found after the optimizer stepped",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "            if a.shape != w.shape or a.dtype != w.dtype or type(a) is not type(w):",
        "replace": "            if a.shape != w.shape or type(a) is not type(w):",
        "tests": [f"{ADV}::test_a_model_changed_after_the_ema_began_is_refused_before_the_update"],
        "why": "adversarial: a model cast to another dtype passes the check; the fused update fails after the step",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "    live = averages.matched(model)  # checked before the first copy",
        "replace": "    live = model_tensors(model)  # checked before the first copy",
        "tests": [f"{ADV}::test_evaluating_the_average_of_a_changed_model_leaves_the_model_whole"],
        "why": "adversarial: the evaluation's swap fails part-way, leaving some tensors holding the averages",
    },
    {
        "file": "src/composetrain/transforms/_averages.py",
        "find": "            mine[k] = mine[k].to(live[k].device)",
        "replace": "            pass",
        "tests": [f"{ADV}::test_the_averages_follow_their_weights_to_another_device"],
        "why": "adversarial: averages stay behind when the model is placed after they were made (pipeline_split)",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "    averages = _saved_averages(transforms[KEY]) if KEY in transforms else model_tensors(state.model)",
        "replace": "    averages = transforms[KEY]['averages'] if transforms.get(KEY) is not None else model_tensors(state.model)",
        "tests": [f"{ADV}::test_ema_model_of_a_crafted_unclaimed_checkpoint_is_refused_clearly"],
        "why": "adversarial: a crafted unclaimed EMA state gives the model's own weights or a bare KeyError",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "        self._agree()\n",
        "replace": "\n",
        "tests": [
            "tests/test_ema_ranks.py::test_ranks_that_average_differently_are_refused_by_ct_run_before_the_first_update"
        ],
        "why": "adversarial: ranks with different decays each keep their own average, silently",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "        mine = [self.decay, self.every, self.warmup, FORMULAS.index(self.formula)]",
        "replace": "        mine = [0.0, self.every, self.warmup, FORMULAS.index(self.formula)]",
        "tests": [
            "tests/test_ema_ranks.py::test_ranks_that_average_differently_are_refused_by_ct_run_before_the_first_update"
        ],
        "why": "adversarial: the ranks compare everything but the decay",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            _check_epochs_left(state, schedule, at)\n",
        "replace": "",
        "tests": [f"{ADV}::test_a_per_epoch_one_cycle_too_short_for_the_run_is_refused_before_the_first_update"],
        "why": "adversarial: a too-short per-epoch OneCycleLR fails after training the last epoch, before its checkpoint",
    },
    {
        "file": "src/composetrain/core/schedules.py",
        "find": "or steps <= total - taken:",
        "replace": "or steps < total - taken:",
        "tests": [f"{ADV}::test_a_per_epoch_one_cycle_too_short_for_the_run_is_refused_before_the_first_update"],
        "why": "adversarial: off by one: a OneCycleLR with exactly the epochs' steps is refused",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        by_steps = (schedule.max_steps - state.step + at.position) // schedule.per_epoch",
        "replace": "        by_steps = schedule.epochs or 0",
        "tests": [f"{ADV}::test_a_per_epoch_one_cycle_too_short_for_the_run_is_refused_before_the_first_update"],
        "why": "adversarial: max_steps ignored: a run that stops before the schedule ends is refused",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": '                    if scheduler_interval == "epoch"',
        "replace": '                    if scheduler_interval == "update"',
        "tests": [f"{ADV}::test_reduce_lr_on_plateau_is_refused_for_the_interval_asked"],
        "why": "adversarial: ReduceLROnPlateau refused with the other interval's reason",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": "        self.scheduler_interval = INTERVALS[INTERVALS.index(scheduler_interval)]",
        "replace": "        self.scheduler_interval = scheduler_interval",
        "tests": [f"{ADV}::test_string_likes_are_kept_as_plain_strings_so_checkpoints_load_without_code"],
        "why": "adversarial: a NumPy string kept as given: ct.run's first checkpoint refuses the state",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "    formula = FORMULAS[FORMULAS.index(formula)]",
        "replace": "    formula = formula",
        "tests": [f"{ADV}::test_string_likes_are_kept_as_plain_strings_so_checkpoints_load_without_code"],
        "why": "adversarial: a NumPy string formula kept as given: the step prints formula=np.str_('sum')",
    },
]
