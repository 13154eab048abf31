"""The planted bugs of src/composetrain/transforms/spikes.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": ('                if stats.mean\n                else ""\n'),
        "replace": ('                if True\n                else ""\n'),
        "tests": [
            "tests/test_skip_spikes.py::test_max_consecutive_skips_before_any_accepted_update_raise_the_guards_error",
        ],
        "why": "the averages listed before any was made: a bare zip() ValueError instead of the guard's error",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": "everyone = ctx.gather(mine) if ctx.gather is not None else [mine]",
        "replace": "everyone = [mine]",
        "tests": [
            "tests/test_skip_spikes.py::test_a_spike_on_one_rank_is_skipped_by_every_rank_as_a_hand_written_agreed_loop_skips_it",
        ],
        "why": "the decision taken on each rank's own loss (pitfall 46): rank 1 skips alone, the models part",
        "from": "observability",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": "applied = self._inner().update(state, ctx._replace(skip_update=True) if spike else ctx)",
        "replace": "applied = self._inner().update(state, ctx)",
        "tests": [
            "tests/test_skip_spikes.py::test_a_skipped_update_leaves_params_optimizer_scheduler_and_step_as_they_were",
        ],
        "why": "a spike counted as skipped but applied",
        "from": "observability",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": ("            stats.consecutive = 0\n            stats.accept(values, self.decay)"),
        "replace": (
            "            stats.consecutive = 0\n"
            "        stats.accept(values, self.decay)\n"
            "        if False:\n"
            "            pass"
        ),
        "tests": [
            "tests/test_skip_spikes.py::test_the_guard_equals_a_hand_written_skip_loop_bit_for_bit",
        ],
        "why": "a skipped spike enters the running averages (the spread it widens hides the next spike)",
        "from": "observability",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": ("        if not all(math.isfinite(v) for v in values):\n            return True\n"),
        "replace": "",
        "tests": [
            "tests/test_skip_spikes.py::test_the_guard_equals_a_hand_written_skip_loop_bit_for_bit",
        ],
        "why": "a NaN loss is not skipped (nan > threshold is False): the update trains on NaN gradients",
        "from": "observability",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": "            stats.consecutive = 0\n",
        "replace": "",
        "tests": [
            "tests/test_skip_spikes.py::test_a_skipped_update_leaves_params_optimizer_scheduler_and_step_as_they_were",
        ],
        "why": "the run of skips is never ended by an applied update: spread-out spikes raise as if in a row",
        "from": "observability",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": "weight = 1 - decay ** (self.accepted - 1)",
        "replace": "weight = 1.0",
        "tests": [
            "tests/test_skip_spikes.py::test_a_young_guard_measures_the_spread_it_has_seen_and_skips_no_ordinary_update",
        ],
        "why": "the variance's start at 0 not corrected: a young guard skips ordinary updates as spikes",
        "from": "observability",
    },
    {
        "file": "src/composetrain/transforms/spikes.py",
        "find": (
            'self.accepted, self.consecutive, self.skipped = saved["accepted"], saved["consecutive"], saved["skipped"]'
        ),
        "replace": "self.accepted, self.consecutive, self.skipped = 0, 0, 0",
        "tests": [
            "tests/test_skip_spikes.py::test_a_resume_mid_way_judges_exactly_as_the_straight_run",
        ],
        "why": "the counters not restored from the checkpoint: a resumed run warms up again and misses a spike",
        "from": "observability",
    },
]
