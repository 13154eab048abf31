# ruff: noqa: E501
"""Planted bugs for issue 36 (profiler windows, throughput and FLOPs, stragglers, the spike guard), each caught by
the tests named."""

SPIKES = "tests/test_skip_spikes.py"
STRAGGLERS = "tests/test_stragglers.py"
FLOPS = "tests/test_flops.py"
PROFILE = "tests/test_profile_window.py"

HAND = f"{SPIKES}::test_the_guard_equals_a_hand_written_skip_loop_bit_for_bit"
RANKS = f"{SPIKES}::test_a_spike_on_one_rank_is_skipped_by_every_rank_as_a_hand_written_agreed_loop_skips_it"
SLOWED = f"{STRAGGLERS}::test_the_slowed_rank_is_named_with_its_host_and_what_it_waited_on"

MUTANTS = [
    # -- the spike guard ---------------------------------------------------------------------------------------
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": "everyone = ctx.gather(mine) if ctx.gather is not None else [mine]",
        "replace": "everyone = [mine]",
        "tests": [RANKS],
        "why": "the decision taken on each rank's own loss (pitfall 46): rank 1 skips alone, the models part",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": "applied = self._inner().update(state, ctx._replace(skip_update=True) if spike else ctx)",
        "replace": "applied = self._inner().update(state, ctx)",
        "tests": [f"{SPIKES}::test_a_skipped_update_leaves_params_optimizer_scheduler_and_step_as_they_were"],
        "why": "a spike counted as skipped but applied",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": "            stats.consecutive = 0\n            stats.accept(values, self.decay)",
        "replace": "            stats.consecutive = 0\n        stats.accept(values, self.decay)\n        if False:\n            pass",
        "tests": [HAND],
        "why": "a skipped spike enters the running averages (the spread it widens hides the next spike)",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": "        if not all(math.isfinite(v) for v in values):\n            return True\n",
        "replace": "",
        "tests": [HAND],
        "why": "a NaN loss is not skipped (nan > threshold is False): the update trains on NaN gradients",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": "            stats.consecutive = 0\n",
        "replace": "",
        "tests": [f"{SPIKES}::test_a_skipped_update_leaves_params_optimizer_scheduler_and_step_as_they_were"],
        "why": "the run of skips is never ended by an applied update: spread-out spikes raise as if in a row",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": "weight = 1 - decay ** (self.accepted - 1)",
        "replace": "weight = 1.0",
        "tests": [f"{SPIKES}::test_a_young_guard_measures_the_spread_it_has_seen_and_skips_no_ordinary_update"],
        "why": "the variance's start at 0 not corrected: a young guard skips ordinary updates as spikes",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": 'self.accepted, self.consecutive, self.skipped = saved["accepted"], saved["consecutive"], saved["skipped"]',
        "replace": "self.accepted, self.consecutive, self.skipped = 0, 0, 0",
        "tests": [f"{SPIKES}::test_a_resume_mid_way_judges_exactly_as_the_straight_run"],
        "why": "the counters not restored from the checkpoint: a resumed run warms up again and misses a spike",
    },
    # -- stragglers ----------------------------------------------------------------------------------------------
    {
        "file": "src/composetrain/driver/stragglers.py",
        "find": "mine.own > threshold * median and",
        "replace": "mine.own < threshold * median and",
        "tests": [f"{STRAGGLERS}::test_a_rank_waiting_on_data_is_named_so"],
        "why": "the straggler threshold inverted: the fast ranks are named",
    },
    {
        "file": "src/composetrain/driver/stragglers.py",
        "find": '"cause": "data" if data >= compute else "compute"',
        "replace": '"cause": "compute" if data >= compute else "data"',
        "tests": [f"{STRAGGLERS}::test_a_rank_waiting_on_data_is_named_so"],
        "why": "the cause swapped: a rank waiting on its loader sent to check its GPU",
    },
    {
        "file": "src/composetrain/driver/stragglers.py",
        "find": "return max(self.step - self.waited, 0.0)",
        "replace": "return self.step",
        "tests": [f"{STRAGGLERS}::test_a_rank_computing_slowly_is_named_so_though_every_step_lasts_as_long"],
        "why": "the waits for the others not taken off: every rank's step is as long as the slowest's, none is named",
    },
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": "return last.around(replica.wait_for_gradients())",
        "replace": "return last.around(contextlib.nullcontext())",
        "tests": [SLOWED],
        "why": "distributed does not time the gradient all-reduce's wait: the rank slow in its step goes unnamed",
    },
    # -- throughput ----------------------------------------------------------------------------------------------
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "        self.done = True\n",
        "replace": "",
        "tests": [f"{FLOPS}::test_the_flops_are_counted_on_the_first_update_only"],
        "why": "the FLOPs counted on every update (FlopCounterMode slows each down)",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": "return float(self.total) if samples == self.samples else self.total * samples / self.samples",
        "replace": "return float(self.total)",
        "tests": [f"{FLOPS}::test_an_update_of_another_size_is_scaled_by_its_samples"],
        "why": "a short update's FLOPs taken as a full one's",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "per_update = flops * world / updates if",
        "replace": "per_update = flops / updates if",
        "tests": [SLOWED],
        "why": "flops_per_update of one rank, not of the global batch",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "record.update(self._throughput(samples_ * world, units * world, flops, updates, elapsed))",
        "replace": "record.update(self._throughput(samples_, units, flops, updates, elapsed))",
        "tests": [SLOWED],
        "why": "samples_per_s the ranks' mean, not their sum",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": 'fields["mfu"] = mfu(per_update, rate, self.peak, world)',
        "replace": 'fields["mfu"] = mfu(per_update, rate, self.peak, 1)',
        "tests": [SLOWED],
        "why": "MFU against one device's peak while every rank's FLOPs are counted",
    },
    {
        "file": "src/composetrain/driver/throughput.py",
        "find": '            f.write("5")  # resets VmHWM to the current resident size\n',
        "replace": "            pass\n",
        "tests": [f"{FLOPS}::test_each_record_holds_its_own_peak_memory"],
        "why": "the peak memory never reset: every later record repeats the run's peak",
    },
    # -- the profiler window -------------------------------------------------------------------------------------
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "marked = _torch_profiler._is_profiler_enabled",
        "replace": "marked = True",
        "tests": [
            f"{PROFILE}::test_a_train_step_marks_its_phases_for_any_profiler_and_calls_no_record_function_without_one"
        ],
        "why": "record_function on every update, profiler or not (a dispatcher call per phase)",
    },
    {
        "file": "src/composetrain/driver/profiling.py",
        "find": "        if self.left == 0:\n            self.profiler.stop()\n            self.profiler = None\n",
        "replace": "",
        "tests": [f"{PROFILE}::test_no_profiler_exists_and_nothing_is_marked_outside_the_windows"],
        "why": "the profiler left running after its window: it records every later update, and no second window",
    },
    {
        "file": "src/composetrain/driver/profiling.py",
        "find": "                self.watch.window.after()\n",
        "replace": "                pass\n",
        "tests": [f"{PROFILE}::test_the_windows_traces_parse_and_hold_their_updates_and_phases"],
        "why": "the profiler never stepped: its schedule stays in warm-up, no trace is written",
    },
]
