"""The planted bugs of src/composetrain/driver/run.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            call_hook(self.options.on_epoch_start, "on_epoch_start", self.state, at.epoch)',
        "replace": "            self.options.on_epoch_start(self.state, at.epoch)",
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_hook_that_moves_the_runs_count_or_swaps_what_it_trains_is_refused_at_once",
        ],
        "why": (
            "adv37: on_epoch_start called around the check: a hook moving the count at an epoch's start let through"
        ),
        "from": "adv37",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '                raise ValueError(theirs if theirs == problem else f"{theirs} (on rank {rank})")\n',
        "replace": "                pass\n",
        "tests": [
            "tests/test_flops.py::test_a_precision_to_look_up_is_refused_before_a_resume_loads_the_checkpoint_or_a_file_is_made",
            "tests/test_flops.py::test_a_precision_to_look_up_is_refused_on_the_cpu_before_the_first_update",
        ],
        "why": "a peak the table lacks for this device dropped: the run trains on without mfu, silently",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        everyone = proc.differing((watch.straggler_threshold, watch.peak_flops, problem))\n",
        "replace": "        everyone = proc.differing((DEFAULT_THRESHOLD, watch.peak_flops, problem))\n",
        "tests": [
            "tests/test_stragglers.py::test_ranks_given_other_thresholds_or_peaks_refuse_together_before_the_first_update",
        ],
        "why": "the ranks' thresholds not compared: each rank names other stragglers in its records and bottleneck",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            self.settings["num_workers"] = self.stream.num_workers\n',
        "replace": "",
        "tests": [
            "tests/test_streams_torchdata.py::test_a_stream_resumed_with_another_number_of_workers_is_refused_before_anything_changes",
        ],
        "why": "a stream's state of 2 workers handed to 0 or 1: a misleading error after the model was loaded",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        self.started_at = state.step\n",
        "replace": "",
        "tests": [
            "tests/test_global_batch.py::test_a_resumed_runs_loader_workers_draw_new_numbers_not_the_fresh_starts_again",
        ],
        "why": "the resume point never reaches the loader: its workers draw the fresh start's numbers again",
        "from": "adversary32",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            eval_batch = functools.partial(step_fn.forward_size, state, per_process)",
        "replace": "            eval_batch = per_process",
        "tests": [
            "tests/test_global_batch.py::test_evaluation_reads_batches_no_larger_than_the_training_forward",
        ],
        "why": "evaluation reads G/W at once again: twice as much on half the processes, beside bounded training",
        "from": "adversary32",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": " and proc.is_main and isinstance(dataset, Sized):",
        "replace": " and not proc.is_main and isinstance(dataset, Sized):",
        "tests": [
            "tests/test_resume_anywhere.py::test_batchnorm_that_makes_the_run_depend_on_the_number_of_processes_is_warned_of",
        ],
        "why": "the BatchNorm warning said by every rank but 0: the user's rank-0 log never shows it",
        "from": "adversary32",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            self.compile_cache.enter()",
        "replace": "            pass",
        "tests": [
            "tests/test_compile_run.py::test_a_restarted_run_compiles_from_the_caches_kept_beside_its_checkpoints",
        ],
        "why": "23.9: torch's caches stay in the machine's /tmp: a requeued job on another node compiles cold",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            self.compile_cache.leave()  # torch's caches where they were before the run",
        "replace": "            pass",
        "tests": [
            "tests/test_compile_run.py::test_a_restarted_run_compiles_from_the_caches_kept_beside_its_checkpoints",
            "tests/test_compile_run.py::test_a_run_that_fails_gives_the_cache_folder_back_at_once",
        ],
        "why": "23.16: after ct.run, the process keeps compiling into the run's checkpoint_dir",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": ("        if self.options.eval.scheduler_metric is None:\n            self.state.end_epoch()\n"),
        "replace": ("        if self.options.eval.scheduler_metric is None:\n            pass\n"),
        "tests": [
            "tests/test_epoch_schedules.py::test_ct_run_steps_the_recipe_schedule_per_epoch_and_uses_its_rates_exactly",
        ],
        "why": "24.3: ct.run never steps a per-epoch scheduler",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": ("                    d.end_epoch(at)\n                    at.next_epoch()"),
        "replace": (
            "                    at.next_epoch()\n"
            "                if due.save or stopping:\n"
            "                    d.end_epoch(at)"
        ),
        "tests": [
            "tests/test_epoch_schedules.py::test_a_resume_steps_the_epoch_scheduler_neither_twice_nor_never",
        ],
        "why": (
            "24.3: stepped with each save, not each epoch end: twice per epoch with checkpoint_every, at a stop too"
        ),
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "updates // schedule.per_epoch if epoch else updates,",
        "replace": "updates,",
        "tests": [
            "tests/test_epoch_schedules.py::test_ct_run_steps_the_recipe_schedule_per_epoch_and_uses_its_rates_exactly",
        ],
        "why": "24.3: a per-epoch scheduler's steps counted in updates: a right schedule is warned about",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": ('            with weights:\n                entry[f"eval_{kind}"] = self.evaluator(self.state.model)'),
        "replace": '            entry[f"eval_{kind}"] = self.evaluator(self.state.model)',
        "tests": [
            "tests/test_ema.py::test_ct_run_evaluates_the_model_and_the_average_and_leaves_the_training_untouched",
        ],
        "why": "24.4: eval_ema evaluates the model's own weights",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            _check_epochs_left(state, schedule, at)\n",
        "replace": "",
        "tests": [
            "tests/test_epoch_schedules.py::test_a_per_epoch_one_cycle_too_short_for_the_run_is_refused_before_the_first_update",
        ],
        "why": (
            "adversarial: a too-short per-epoch OneCycleLR fails after training the last epoch, before its checkpoint"
        ),
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        by_steps = (schedule.max_steps - state.step + at.position) // schedule.per_epoch",
        "replace": "        by_steps = schedule.epochs or 0",
        "tests": [
            "tests/test_epoch_schedules.py::test_a_per_epoch_one_cycle_too_short_for_the_run_is_refused_before_the_first_update",
        ],
        "why": "adversarial: max_steps ignored: a run that stops before the schedule ends is refused",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": ('            if everyone is not None:\n                shown = ", ".join(f"rank {r} {roles}"'),
        "replace": ('            if False:\n                shown = ", ".join(f"rank {r} {roles}"'),
        "tests": [
            "tests/test_ema_ranks.py::test_ct_ema_on_one_rank_only_is_refused_on_every_rank_before_the_setup",
        ],
        "why": "adversarial: ranks composing different transforms meet in mismatched collectives (a timeout)",
        "from": "issue24_ema",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": (
            "        lr = _rates_used(self.state.optimizer)  # before the step: the scheduler steps inside it\n"
            "        with self.watch.update(self.state.step + 1, batch):  # FLOPs counted on the first; the "
            "profiler's window\n"
            "            out = self.step_fn(self.state, batch)\n"
        ),
        "replace": (
            "        with self.watch.update(self.state.step + 1, batch):  # FLOPs counted on the first; the "
            "profiler's window\n"
            "            out = self.step_fn(self.state, batch)\n"
            "        lr = _rates_used(self.state.optimizer)  # before the step: the scheduler steps inside it\n"
        ),
        "tests": [
            "tests/test_run_lr.py::test_the_logged_rate_is_the_one_each_update_used_from_the_warmups_first",
        ],
        "why": "24.2: the rate read after the scheduler stepped: the next update's (the old behaviour)",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "    return [lr.detach().clone() if isinstance(lr, torch.Tensor) else lr for lr in rates]",
        "replace": "    return [lr.detach() if isinstance(lr, torch.Tensor) else lr for lr in rates]",
        "tests": [
            "tests/test_run_lr.py::test_a_tensor_rate_is_logged_as_it_was_used",
        ],
        "why": "24.2: a tensor rate kept as an alias, which the scheduler fills in place with the next rate",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        used = [None] * groups if self.used_lr is None else self.used_lr",
        "replace": (
            '        used = [g["lr"] for g in state.optimizer.param_groups] if self.used_lr is None else self.used_lr'
        ),
        "tests": [
            "tests/test_run_lr.py::test_a_window_no_update_of_this_process_made_logs_no_rate",
        ],
        "why": "24.2: a window made by an earlier process logged with the optimizer's current (next) rate",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "self.stop.check(also=self.log.records.failed is not None, extra=self.saves.flags())",
        "replace": "self.stop.check(extra=self.saves.flags())",
        "tests": [
            "tests/test_run_tracker.py::test_a_tracker_that_raises_stops_the_run_saved_and_the_error_names_the_record",
        ],
        "why": "24.5: a failed tracker does not stop the run: it trains on untracked to the end",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '    rates = [g.get("lr") for g in optimizer.param_groups]',
        "replace": '    rates = [g["lr"] for g in optimizer.param_groups]',
        "tests": [
            "tests/test_run_lr.py::test_an_optimizer_without_a_rate_trains_and_logs_none",
        ],
        "why": "a-recipes: an optimizer without an lr key: KeyError before the first update",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "    return next((n for (n, _), ok in zip(named, finite.tolist(), strict=True) if not ok), None)",
        "replace": "    return None",
        "tests": [
            "tests/test_checkpoint_trust.py::test_a_diverged_model_is_never_saved_and_the_finite_checkpoints_stay",
        ],
        "why": "29.11: no finiteness check: NaN weights saved, the finite checkpoints pruned",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "    named = [(n, p) for n, p in named if p.is_floating_point() or p.is_complex()]",
        "replace": (
            "    named = [(n, p) for n, p in named if p.is_floating_point() or p.is_complex()]\n"
            "    named += [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]"
        ),
        "tests": [
            "tests/test_checkpoint_trust.py::test_an_inf_buffer_is_no_divergence",
        ],
        "why": "29.11: buffers checked too: a mask of -inf refuses every save",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": (
            "            at = d.resume(schedule, options.loader.seed)\n"
            "            d.refuse_in_the_way(schedule, state.step)  # before training, not after it\n"
            "            _check_horizon(state, schedule, at.resumed)"
        ),
        "replace": (
            "            _check_horizon(state, schedule, False)\n"
            "            at = d.resume(schedule, options.loader.seed)\n"
            "            d.refuse_in_the_way(schedule, state.step)  # before training, not after it"
        ),
        "tests": [
            "tests/test_epoch_schedules.py::test_a_finished_run_continued_for_more_epochs_is_warned_about_the_schedule_it_restored",
        ],
        "why": "29.10: the horizon checked on the given scheduler, before the checkpoint's replaces it",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "    ends = schedule.epochs - at.epoch if schedule.epochs is not None else None",
        "replace": "    ends = schedule.epochs if schedule.epochs is not None else None",
        "tests": [
            "tests/test_epoch_schedules.py::test_a_one_cycle_schedule_of_exactly_the_runs_epochs_resumes_part_way",
        ],
        "why": (
            "30.6: the epochs already done are counted again against the OneCycleLR's steps left: a resume refused"
        ),
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": (
            '    changed = [f"{k} {restored[k]!r} (given {v!r})" for k, v in given.items() if k in restored and '
            "restored[k] != v]"
        ),
        "replace": (
            '    changed = [f"{k} {restored[k]!r} (given {v!r})" for k, v in given.items() if k in restored and '
            "restored[k] != v and 'lr' not in k]"
        ),
        "tests": [
            "tests/test_run_lr.py::test_settings_given_to_a_resumed_run_that_the_checkpoint_replaces_are_named",
        ],
        "why": "29 unclear: a new lr given on resume silently ignored",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '    scheduled = set() if state.scheduler is None else {"lr"}',
        "replace": "    scheduled = set()",
        "tests": [
            "tests/test_run_lr.py::test_a_resume_with_the_same_settings_says_nothing_though_the_schedule_moved_the_rates",
        ],
        "why": "29 unclear: the scheduled lr compared: every resume under a scheduler warns",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "and (n == last or bool(per_epoch and n % per_epoch == 0) or bool(every and n % every == 0))",
        "replace": "and (n == last or bool(every and n % every == 0))",
        "tests": [
            "tests/test_checkpoint_folder.py::test_a_folder_without_state_pt_where_the_run_saves_is_refused_before_training",
        ],
        "why": "29 unclear: a folder at an epoch end's save is found only after training up to it",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        done = at.epoch + (at.position == self.per_epoch or at.ended)",
        "replace": "        done = at.epoch",
        "tests": [
            "tests/test_run_loop.py::test_log_and_evaluation_records_number_the_epoch_alike",
        ],
        "why": "29 unclear: the log record at an epoch's end numbers the epoch unlike its evaluation",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '    if any(getattr(s, "cycle_momentum", False) is True for s in inner):\n',
        "replace": "    if state.scheduler is not None:\n",
        "tests": [
            "tests/test_run_lr.py::test_settings_given_to_a_resumed_run_that_the_checkpoint_replaces_are_named",
        ],
        "why": (
            "a new momentum given to a resumed run under StepLR/CosineAnnealingLR is silently replaced by the "
            "checkpoint's"
        ),
        "from": "issue29_x_run",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            seed_everything(derive_seed(seed, "resume", rank=self.shard, step=state.step))',
        "replace": '            seed_everything(derive_seed(seed, "fresh start", rank=self.shard))',
        "tests": [
            "tests/test_resume_anywhere.py::test_a_chain_of_runs_on_2_1_3_2_processes_ends_as_the_uninterrupted_run",
        ],
        "why": "a resume on another world size starts the fresh start's streams again, whatever the position",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            seed_everything(derive_seed(seed, "resume", rank=self.shard, step=state.step))',
        "replace": (
            '            seed_everything(derive_seed(seed, "resume", rank=self.shard, step=state.step * '
            "self.proc.world_size))"
        ),
        "tests": [
            "tests/test_resume_anywhere.py::test_a_chain_of_runs_on_2_1_3_2_processes_ends_as_the_uninterrupted_run",
        ],
        "why": "the resumed streams depend on the world size: two resumes of one checkpoint draw differently",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        over_ranks = self.meter.over_ranks(at.window) if elastic else []",
        "replace": "        over_ranks = []",
        "tests": [
            "tests/test_resume_anywhere.py::test_a_chain_of_runs_on_2_1_3_2_processes_ends_as_the_uninterrupted_run",
        ],
        "why": "the unlogged window is not reduced into state.pt: a resume on another W loses those updates' records",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            "global_batch_size": global_batch,',
        "replace": '            "global_batch_size": None,',
        "tests": [
            "tests/test_global_batch.py::test_a_changed_global_batch_size_is_refused_naming_both",
        ],
        "why": "the settings compared on resume skip G: 8 and 9 (the same updates per epoch) resume each other",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        if old is not None and new is not None:",
        "replace": "        if False:",
        "tests": [
            "tests/test_global_batch.py::test_a_changed_global_batch_size_is_refused_naming_both",
        ],
        "why": "a changed G is refused as any setting, without naming both values nor saying it changes the run",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": ('        if local is not None:\n            restore_rng(local["rng"])'),
        "replace": (
            "        if local is not None and not self.options.loader.global_batch_size:\n"
            '            restore_rng(local["rng"])'
        ),
        "tests": [
            "tests/test_resume_anywhere.py::test_on_the_same_number_of_processes_a_global_batch_run_resumes_bit_for_bit",
        ],
        "why": "a global batch's run reseeds also on the same W: dropout no longer resumes bit for bit",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": (
            "                local_world_size=proc.local_world_size,\n"
            "                equal_shares=can.forward_needs_every_rank,\n"
        ),
        "replace": ("                local_world_size=proc.local_world_size,\n                equal_shares=False,\n"),
        "tests": [
            "tests/test_resume_anywhere.py::test_what_cannot_be_exact_is_refused_before_anything_changes",
        ],
        "why": "ct.sharded's uneven short update is found at the epoch's last update, after training, not before",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": 'seed_everything(derive_seed(seed, "fresh start", rank=self.shard))',
        "replace": 'seed_everything(derive_seed(seed, "fresh start", rank=0))',
        "tests": [
            "tests/test_rng_streams.py::test_each_rank_draws_its_own_streams_on_a_fresh_start",
        ],
        "why": "20.12: every rank seeded alike: the ranks draw the same random numbers",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": ("                rank=self.shard,\n                world_size=self.shards,\n"),
        "replace": ("                rank=proc.rank,\n                world_size=proc.world_size,\n"),
        "tests": [
            "tests/test_meshes.py::test_tensor_parallel_checkpoints_load_at_another_degree_and_in_one_process",
        ],
        "why": (
            "ct.run gives each rank of a tensor-parallel group its own data: the group computes on mismatched batches"
        ),
        "from": "meshes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": (
            "                data_shards=[can.data_shard(r, proc.world_size)[0] for r in range(proc.world_size)],\n"
        ),
        "replace": "",
        "tests": [
            "tests/test_meshes.py::test_a_global_batch_run_splits_it_over_data_shards_and_resumes_on_another_mesh",
        ],
        "why": "the driver stamps rank r as shard r whatever the mesh: a layout change at the same W goes unseen",
        "from": "meshes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            per_shard=proc.world_size // self.shards,\n",
        "replace": "",
        "tests": [
            "tests/test_meshes.py::test_bad_layouts_and_plans_are_refused_on_every_rank_alike[global_batch_tp]",
        ],
        "why": "a global batch refused under TP counts its data shards as processes: '2 processes' on a job of 4",
        "from": "meshes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": 'record["global_batch"] = None if batch is None else batch * self.shards',
        "replace": 'record["global_batch"] = None if batch is None else batch * self.proc.world_size',
        "tests": [
            "tests/test_meshes.py::test_a_global_batch_run_splits_it_over_data_shards_and_resumes_on_another_mesh",
        ],
        "why": "the logged global batch (ct.scaled_lr's input) counts a TP pair's or a pipeline's shared shard twice",
        "from": "meshes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": (
            "            if self.checkpoints is not None and not self.checkpoints.local and _holds_dtensors(state):"
        ),
        "replace": "            if False:",
        "tests": [
            "tests/test_checkpoint_objects.py::test_two_ranks_save_into_one_checkpoint_in_s3_and_sharded_states_are_refused",
        ],
        "why": "a sharded state with object storage is refused only at its first save, after training up to it",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": ('            if stream is not None and stream.mode == "state"\n            else (None, None)'),
        "replace": ("            if False\n            else (None, None)"),
        "tests": [
            "tests/test_streams.py::test_checkpoints_hold_each_ranks_stream_state_and_load_with_weights_only",
        ],
        "why": "the stream's state is not saved: a resume cannot continue it",
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": ("        if at.epoch == 0:\n            stream = self.stream"),
        "replace": ("        if False:\n            stream = self.stream"),
        "tests": [
            "tests/test_streams.py::test_a_stream_that_gives_nothing_is_refused_before_training",
        ],
        "why": "a stream that gives no batch at all ends the run silently, nothing trained",
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        short = options.max_steps is not None and not at.reached_max(state.step)",
        "replace": "        short = False",
        "tests": [
            "tests/test_streams.py::test_max_steps_ends_an_endless_stream_and_a_stream_that_ends_first_says_so",
        ],
        "why": "a stream that ends before max_steps ends the run without saying so",
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        done = at.epoch + (at.position == self.per_epoch or at.ended)",
        "replace": "        done = at.epoch + (at.position == self.per_epoch)",
        "tests": [
            "tests/test_streams.py::test_each_pass_is_an_epoch_begun_with_set_epoch_and_ended_saved",
        ],
        "why": "the record at a pass's end numbers the epoch before it",
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": ("        if self.options.eval.scheduler_metric is None:\n            self.state.end_epoch()\n"),
        "replace": "        self.state.end_epoch()\n",
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_plateau_scheduler_is_fed_each_epochs_evaluation_as_by_hand",
        ],
        "why": "37.2: a scheduler fed a metric also stepped at the epoch's end without it (refused mid-run)",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        if self.options.on_epoch_start is not None:\n",
        "replace": "        if self.options.on_epoch_start is not None and at.position == 0:\n",
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_resumed_run_runs_each_epoch_end_once_and_restarts_the_epoch_it_resumes",
        ],
        "why": "37.5: on_epoch_start skipped for the epoch a run resumes part-way: mixup stays on after its epoch",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            call_hook(self.options.on_epoch_end, "on_epoch_end", self.state, at.epoch)',
        "replace": '            call_hook(self.options.on_epoch_end, "on_epoch_end", self.state, at.epoch + 1)',
        "tests": [
            "tests/test_run_epoch_ends.py::test_the_hooks_run_at_each_epochs_start_and_end_in_order",
        ],
        "why": "37.5: on_epoch_end told the next epoch, not the one that ended",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": (
            "                    d.end_epoch(at)\n"
            "                    at.next_epoch()\n"
            "                    batches = None\n"
            "                if due.save or stopping or clock:  # save, then evaluate: a failed evaluation must "
            "not cost the save\n"
            "                    d.save(at, last=stopping or at.finished(state.step))\n"
        ),
        "replace": (
            "                    at.next_epoch()\n"
            "                    batches = None\n"
            "                if due.save or stopping or clock:  # save, then evaluate: a failed evaluation must "
            "not cost the save\n"
            "                    d.save(at, last=stopping or at.finished(state.step))\n"
            "                if due.epoch_end:\n"
            "                    d.end_epoch(at)\n"
        ),
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_resumed_run_runs_each_epoch_end_once_and_restarts_the_epoch_it_resumes",
        ],
        "why": "37.5: the epoch end's hook after its checkpoint: a resume there never runs it",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": (
            "            check_metric_kind(options.eval.scheduler_metric, step_fn.eval_weights(state))  # after "
            "its setup\n"
        ),
        "replace": "",
        "tests": [
            "tests/test_run_epoch_ends.py::test_a_metric_of_weights_the_composition_does_not_evaluate_is_refused_before_training",
        ],
        "why": "37.2: 'eval_ema.*' without ct.ema found at the first evaluation, after an epoch's training",
        "from": "timm_recipes",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        self.saves.resumed = True",
        "replace": "        self.saves.resumed = False",
        "tests": [
            "tests/test_checkpoint_async.py::test_with_a_tracker_the_first_checkpoint_is_written_in_the_foreground_and_the_rest_in_the_background",
        ],
        "why": "the driver never tells the saves it resumed: a resumed tracked run's first save stalls",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            step_fn.check_batch_size(state, per_process)\n",
        "replace": "            pass\n",
        "tests": [
            "tests/test_meshes.py",
        ],
        "why": "a batch the pipeline cannot split is refused at the first update, after the folder, locks and log",
        "from": "stop43",
    },
]
