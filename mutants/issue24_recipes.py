"""Planted bugs for issue 24's items 1, 2, 5 and 6 (clipping order, the logged rate, trackers, ct.check), each
caught by the test named for it (see tools/mutants.py)."""

CLIP = "tests/test_clip_order.py::"
LR = "tests/test_run_lr.py::"
TRACK = "tests/test_run_tracker.py::"
CHECK = "tests/test_check.py::"
HOSTILE_CHECK = "tests/test_check_hostile.py::"
HOSTILE_TRACK = "tests/test_run_tracker_hostile.py::"
HOSTILE_LR = "tests/test_run_lr_hostile.py::"

MUTANTS = [
    # -- 24.1: the clipping norm summed in model.parameters() order ------------------------------------------------
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": "    return [p for p in (*model, *outside) if p.grad is not None]",
        "replace": '    return [p for g in state.optimizer.param_groups for p in g["params"] if p.grad is not None]',
        "tests": [CLIP + "test_any_group_split_clips_bit_for_bit_as_model_parameters"],
        "why": "24.1: the norm summed over the optimizer's groups in group order (the old code): last bits differ",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": "    return [p for p in (*model, *outside) if p.grad is not None]",
        "replace": "    return [p for p in model if p.grad is not None]",
        "tests": [CLIP + "test_frozen_parameters_and_parameters_outside_the_optimizer"],
        "why": "24.1: a tensor the optimizer updates outside the model is neither counted nor clipped",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": 'for p in group["params"] if id(p) not in inside]',
        "replace": 'for p in group["params"]]',
        "tests": [CLIP + "test_any_group_split_clips_bit_for_bit_as_model_parameters"],
        "why": "24.1: the optimizer's parameters counted a second time after the model's",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": "    changes_update = True\n",
        "replace": "",
        "tests": [CHECK + "test_the_reference_keeps_the_transforms_that_change_the_update"],
        "why": "24.6: clip_grad_norm not declared as changing the update: ct.check compares it with no clipping",
    },
    # -- 24.2: the rate each update used ---------------------------------------------------------------------------
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        lr = _rate_used(self.state.optimizer)  # before the step: the scheduler steps inside it\n"
        "        with self.watch.update(self.state.step + 1):  # FLOPs counted on the first; the profiler's window\n"
        "            out = self.step_fn(self.state, batch)\n",
        "replace": "        with self.watch.update(self.state.step + 1):  # FLOPs counted on the first; the profiler's window\n"
        "            out = self.step_fn(self.state, batch)\n"
        "        lr = _rate_used(self.state.optimizer)  # before the step: the scheduler steps inside it\n",
        "tests": [LR + "test_the_logged_rate_is_the_one_each_update_used_from_the_warmups_first"],
        "why": "24.2: the rate read after the scheduler stepped: the next update's (the old behaviour)",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "    return lr.detach().clone() if isinstance(lr, torch.Tensor) else lr",
        "replace": "    return lr.detach() if isinstance(lr, torch.Tensor) else lr",
        "tests": [LR + "test_a_tensor_rate_is_logged_as_it_was_used"],
        "why": "24.2: a tensor rate kept as an alias, which the scheduler fills in place with the next rate",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "None if self.used_lr is None else float(self.used_lr)",
        "replace": 'float(state.optimizer.param_groups[0]["lr"]) if self.used_lr is None else float(self.used_lr)',
        "tests": [LR + "test_a_window_no_update_of_this_process_made_logs_no_rate"],
        "why": "24.2: a window made by an earlier process logged with the optimizer's current (next) rate",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '    lr = optimizer.param_groups[0].get("lr")',
        "replace": '    lr = optimizer.param_groups[-1].get("lr")',
        "tests": [LR + "test_with_several_groups_the_first_groups_rate_is_logged"],
        "why": "24.2: the last group's rate logged, not the first's as documented",
    },
    # -- 24.5: on_record -------------------------------------------------------------------------------------------
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            returned = self.on_record(copy.deepcopy(record))",
        "replace": "            returned = self.on_record(record)",
        "tests": [TRACK + "test_every_record_reaches_the_tracker_once_as_the_metrics_file_holds_it"],
        "why": "24.5: the tracker gets the history's own record, and what it changes there changes the history",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "Records(on_record if proc.is_main else None)",
        "replace": "Records(on_record)",
        "tests": [TRACK + "test_on_rank_zero_only"],
        "why": "24.5: every rank calls its tracker: each record sent once per rank",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "            self.records.resume(found, self.path, step)",
        "replace": "            pass",
        "tests": [TRACK + "test_after_a_crash_the_redone_updates_do_not_send_their_records_again"],
        "why": "24.5: a resumed run sends again the records the interrupted run sent after its checkpoint",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": 'or (record["step"], "eval" in record) in self.sent:',
        "replace": 'or (record["step"], "eval" not in record) in self.sent:',
        "tests": [TRACK + "test_after_a_crash_the_redone_updates_do_not_send_their_records_again"],
        "why": "24.5: a training and an evaluation record of one step mistaken for each other",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": 'self.sent.add((record["step"], isinstance(record.get("eval"), dict)))',
        "replace": 'self.sent.add((record["step"], False))',
        "tests": [TRACK + "test_after_a_crash_the_redone_updates_do_not_send_their_records_again"],
        "why": "24.5: the evaluations found in the file counted as training records: the resumed run resends them",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        return self.stop.check(also=self.log.records.failed is not None)",
        "replace": "        return self.stop.check()",
        "tests": [TRACK + "test_a_tracker_that_raises_stops_the_run_saved_and_the_error_names_the_record"],
        "why": "24.5: a failed tracker does not stop the run: it trains on untracked to the end",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            self.failed = (record, e)",
        "replace": "            raise",
        "tests": [TRACK + "test_a_tracker_that_raises_stops_the_run_saved_and_the_error_names_the_record"],
        "why": "24.5: the tracker's exception escapes at once: no save, no word of which record",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "(not callable(self.on_record) or isinstance(self.on_record, type))",
        "replace": "not callable(self.on_record)",
        "tests": [TRACK + "test_a_tracker_that_is_no_function_is_refused_before_anything_runs"],
        "why": "24.5: a class (dict, a tracker class not instantiated) accepted as on_record",
    },
    # -- 24.6: ct.check --------------------------------------------------------------------------------------------
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "        restore_rng(rng)  # both draw the same random numbers",
        "replace": "        pass  # both draw the same random numbers",
        "tests": [CHECK + "test_both_sides_draw_the_same_random_numbers_and_the_users_generators_stay_as_they_were"],
        "why": "24.6: the composition draws after the reference: its dropout masks differ, a false alarm",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "        restore_rng(rng)\n        changed = own.restore()\n",
        "replace": "        changed = own.restore()\n",
        "tests": [
            CHECK + "test_both_sides_draw_the_same_random_numbers_and_the_users_generators_stay_as_they_were",
            HOSTILE_CHECK + "test_the_users_generators_stay_as_they_were_when_the_step_raises_after_drawing",
        ],
        "why": "24.6: the user's random generators left advanced by check's two updates",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    except Exception:  # the model refuses float64",
        "replace": "    except TypeError if False else ZeroDivisionError:  # the model refuses float64",
        "tests": [CHECK + "test_a_model_that_refuses_float64_is_checked_in_its_own_precision"],
        "why": "24.6: the fallback to the model's own precision catches too little: a float32-only model fails check",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "        return self._inner().update(state, ctx)",
        "replace": "        done = self._inner().update(state, ctx)\n"
        "        for name, p in state.model.named_parameters():\n"
        '            self.kept[name] = None if p.grad is None else dense(p.grad.detach()).to("cpu", copy=True)\n'
        "        return done",
        "tests": [CHECK + "test_the_reference_keeps_the_transforms_that_change_the_update"],
        "why": "24.6: the gradients read after the update phase: clipped, not those the update received",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "        for i in range(len(layers) - 1, -1, -1):  # innermost first",
        "replace": "        for i in range(len(layers)):  # innermost first",
        "tests": [CHECK + "test_a_planted_wrong_composition_is_found_and_its_layer_named"],
        "why": "24.6: peeled from the outside: the outermost layer blamed for an inner one's bug",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": '    if low is torch.float64 or "mixed_precision" not in step.roles:',
        "replace": "    if True:",
        "tests": [CHECK + "test_mixed_precision_is_checked_in_its_own_precision_with_its_tolerance"],
        "why": "24.6: mixed_precision judged by float32's tolerance: its own rounding reported as a divergence",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    if world > 1 and step.capabilities.syncs_processes:",
        "replace": "    if world > 1 and step.capabilities.places_model:",
        "tests": [CHECK + "test_a_composition_of_several_processes_is_refused_under_a_group_and_the_rest_checked"],
        "why": "24.6: a distributed composition under a group of two checked against a one-process reference",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    return gap.largest <= atol + rtol * gap.scale",
        "replace": "    return not gap.largest > atol + rtol * gap.scale",
        "tests": [CHECK + "test_a_non_finite_update_is_a_difference"],
        "why": "24.6: a NaN difference compares as no difference (nan > worst is False): a NaN update passes",
    },
    # -- found by the adversary a-recipes (hostile inputs) ---------------------------------------------------------
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "        model._apply(lambda t: _cast(t, dtype))",
        "replace": "        model.to(dtype)",
        "tests": [HOSTILE_CHECK + "test_complex_parameters_are_checked_in_complex128_not_cast_to_real"],
        "why": "a-recipes: Module.to(float64) casts a complex parameter to real: check compares another model",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "    return t.to(torch.complex128) if t.is_complex() else t.double()",
        "replace": "    return t.double()",
        "tests": [HOSTILE_CHECK + "test_complex_parameters_are_checked_in_complex128_not_cast_to_real"],
        "why": "a-recipes: the gaps measured on the real parts of complex tensors only",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    if problem or not (math.isfinite(float(value)) and float(value) >= 0):",
        "replace": "    if problem or not math.isfinite(float(value)):",
        "tests": [HOSTILE_CHECK + "test_nonsense_tolerances_are_clear_errors"],
        "why": "a-recipes: a negative tolerance accepted: every check fails, a right composition reported wrong",
    },
    {
        "file": "src/composetrain/checking/__init__.py",
        "find": "    problem = isinstance(value, bool) or not isinstance(value, numbers.Real)",
        "replace": "    problem = not isinstance(value, numbers.Real)",
        "tests": [HOSTILE_CHECK + "test_nonsense_tolerances_are_clear_errors"],
        "why": "a-recipes: rtol=True taken as 1.0: a 100% tolerance passes anything",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "        _per_tensor(buffers, ref_buffers) if ref_buffers else None,",
        "replace": "        None,",
        "tests": [HOSTILE_CHECK + "test_buffers_a_composition_updates_wrongly_are_a_difference_and_its_layer_named"],
        "why": "a-recipes: buffers not compared: a forward run twice (BatchNorm statistics stepped twice) passes",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": '        saved["transforms"] = map_tensors(saved["transforms"], lambda t: _cast(t, dtype))',
        "replace": "        pass",
        "tests": [HOSTILE_CHECK + "test_a_state_with_averages_already_is_checked_in_float64"],
        "why": "a-recipes: ct.ema's float32 averages refused by the float64 copy: silently checked in float32",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "                t.grad = grad\n",
        "replace": "",
        "tests": [HOSTILE_CHECK + "test_a_tensor_outside_the_model_the_step_closes_over_is_refused"],
        "why": "a-recipes: a changed gradient of the user's reported but left behind",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": '                named.setdefault(id(p), ("an optimizer parameter outside the model", p))',
        "replace": "                pass",
        "tests": [HOSTILE_CHECK + "test_a_tensor_outside_the_model_the_step_closes_over_is_refused"],
        "why": "a-recipes: the optimizer's tensors outside the model not watched: a closure over one goes unseen",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "            if not _same(t.detach(), value):",
        "replace": "            if t._version != value._version:",
        "tests": [HOSTILE_CHECK + "test_a_step_that_reaches_the_users_own_model_is_refused_and_the_model_restored"],
        "why": "a-recipes: changes found by version counters, which BatchNorm's in-place statistics do not bump",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "    copied = TrainState(model, optimizer, scheduler, scheduler_interval=state.scheduler_interval)",
        "replace": "    copied = TrainState(model, optimizer, scheduler)",
        "tests": [HOSTILE_CHECK + "test_a_state_whose_scheduler_steps_per_epoch_is_checked"],
        "why": "a-recipes: the copy steps its scheduler per update: a per-epoch state's scheduler refused (raised)",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "    while isinstance(fn, functools.partial):\n        fn = fn.func\n",
        "replace": "",
        "tests": [HOSTILE_TRACK + "test_a_tracker_whose_call_runs_nothing_is_refused_before_anything_runs"],
        "why": "a-recipes: a partial of an async function not unwrapped: every record lost without a word",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": '    for target in (fn, inspect.getattr_static(type(fn), "__call__", None)):',
        "replace": "    for target in (fn,):",
        "tests": [HOSTILE_TRACK + "test_a_tracker_whose_call_runs_nothing_is_refused_before_anything_runs"],
        "why": "a-recipes: an object with an async __call__ taken as a plain function",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            if kind is not None:  # nothing of it ran",
        "replace": "            if False:  # nothing of it ran",
        "tests": [HOSTILE_TRACK + "test_a_tracker_that_returns_a_generator_stops_the_run_and_says_why"],
        "why": "a-recipes: a tracker returning a generator at run time: its records silently never tracked",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '    lr = optimizer.param_groups[0].get("lr")',
        "replace": '    lr = optimizer.param_groups[0]["lr"]',
        "tests": [HOSTILE_LR + "test_an_optimizer_without_a_rate_trains_and_logs_none"],
        "why": "a-recipes: an optimizer without an lr key: KeyError before the first update",
    },
    {
        "file": "src/composetrain/plot.py",
        "find": '                if not _is_number(v) and not (key == "lr" and v is None)',
        "replace": "                if not _is_number(v)",
        "tests": [HOSTILE_LR + "test_the_plot_takes_a_null_rate_as_no_point_without_a_warning"],
        "why": "a-recipes: ct.run's own lr null warned about as bad data, once per record",
    },
    {
        "file": "src/composetrain/checking/_peeling.py",
        "find": "        if not runs and not _finite(out.loss, grads):",
        "replace": "        if False:",
        "tests": [
            HOSTILE_CHECK + "test_a_batch_the_plain_step_itself_cannot_train_on_is_refused_not_blamed_on_a_layer"
        ],
        "why": "a-recipes: a NaN batch makes the plain step NaN too: the innermost layer blamed for the data",
    },
    {
        "file": "src/composetrain/checking/_copies.py",
        "find": "    return t.to_dense() if t.is_sparse else t",
        "replace": "    return t",
        "tests": [HOSTILE_CHECK + "test_sparse_gradients_are_compared_and_the_users_left_as_they_were"],
        "why": "a-recipes: a sparse gradient (nn.Embedding(sparse=True)) compared as is: NotImplementedError",
    },
]
