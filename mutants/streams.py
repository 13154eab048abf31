"""Planted bugs of issue 33's resumable streams (ct.run over an IterableDataset or a StatefulDataLoader), replayed by
tools/mutants.py; `python tools/regroup_mutants.py` files each entry into its module's catalogue."""

STREAMS = "src/composetrain/driver/streams.py"
PASSES = "src/composetrain/driver/stream_passes.py"
RUN = "src/composetrain/driver/run.py"
T = "tests/test_streams.py::"
TD = "tests/test_streams_torchdata.py::"
TR = "tests/test_streams_ranks.py::"

MUTANTS = [
    {
        "file": PASSES,
        "find": "        agreed = int(largest([float(status)])[0]) if proc.world_size > 1 else status",
        "replace": "        agreed = status",
        "tests": [TR + "test_ranks_whose_streams_end_at_different_updates_stop_together"],
        "why": "each rank decides alone whether it has a batch: a rank whose stream ended leaves the others in DDP's "
        "all-reduce (a hang until the timeout)",
    },
    {
        "file": PASSES,
        "find": "    same = [r for r, d in enumerate(digests) if digests.count(d) > 1]",
        "replace": "    same = [r for r, d in enumerate(digests) if digests.count(d) > 2]",
        "tests": [TR + "test_two_ranks_reading_the_same_share_are_refused_before_training"],
        "why": "two ranks reading the same share go unseen: they train on the same data",
    },
    {
        "file": STREAMS,
        "find": "            self.ended = len(batch) < self.batch_size\n",
        "replace": "            self.ended = False\n",
        "tests": [T + "test_a_stream_that_starts_over_at_its_end_resumes_after_its_short_last_batch"],
        "why": "the end seen inside the last, short batch is not recorded: a stream that starts over at its end is "
        "read again in the same pass after a resume there",
    },
    {
        "file": STREAMS,
        "find": "            if not batch or (self.ended and self.drop_last):",
        "replace": "            if not batch:",
        "tests": [T + "test_drop_last_drops_the_passes_short_batch"],
        "why": "drop_last ignored: the pass's short batch is trained on",
    },
    {
        "file": STREAMS,
        "find": "    try:\n        return make()\n    finally:\n        restore_rng(states)",
        "replace": "    return make()",
        "tests": [TD + "test_a_given_stateful_dataloader_resumes_three_times_across_a_pass_end"],
        "why": "a given loader's new iterator draws its base seed from the global generator: a resume draws it at "
        "another update, and the dropout masks after it differ",
    },
    {
        "file": STREAMS,
        "find": "        if not has_state(data.dataset):",
        "replace": "        if False:",
        "tests": [TD + "test_a_stateful_dataloader_over_a_stream_without_state_is_refused_with_checkpoints"],
        "why": "a StatefulDataLoader over a stream without state is taken: its resume re-reads every batch",
    },
    {
        "file": STREAMS,
        "find": "    return unplain(state, where)",
        "replace": "    return None",
        "tests": [T + "test_a_state_dict_no_checkpoint_could_hold_is_refused_before_training"],
        "why": "a state no weights-only checkpoint can hold is found only at the first save, after training to it",
    },
    {
        "file": STREAMS,
        "find": 'and getattr(data, "state_is_global", False) is True',
        "replace": 'and getattr(data, "state_is_global", False) is None',
        "tests": [TR + "test_a_stream_resumes_on_another_number_of_processes_only_where_its_state_is_the_jobs"],
        "why": "the declaration state_is_global is ignored: its checkpoints never resume on another world size",
    },
    {
        "file": RUN,
        "find": '            if stream is not None and stream.mode == "state"\n            else (None, None)',
        "replace": "            if False\n            else (None, None)",
        "tests": [T + "test_checkpoints_hold_each_ranks_stream_state_and_load_with_weights_only"],
        "why": "the stream's state is not saved: a resume cannot continue it",
    },
    {
        "file": PASSES,
        "find": "    if position == 0 or replay:\n        stream.set_epoch(epoch)",
        "replace": "    if position == 0:\n        stream.set_epoch(epoch)",
        "tests": [T + "test_a_stream_without_state_is_refused_with_checkpoints_and_resumed_by_replay_when_asked"],
        "why": "a replayed pass is read without its set_epoch: a later pass replays the first one's items",
    },
    {
        "file": PASSES,
        "find": "        read = sum(1 for _ in itertools.islice(batches, position))",
        "replace": "        read = sum(1 for _ in itertools.islice(batches, position - 1)) + 1",
        "tests": [T + "test_a_stream_without_state_is_refused_with_checkpoints_and_resumed_by_replay_when_asked"],
        "why": "the replay drops one batch too few: the last batch before the checkpoint is trained on twice",
    },
    {
        "file": RUN,
        "find": "        if at.epoch == 0:\n            stream = self.stream",
        "replace": "        if False:\n            stream = self.stream",
        "tests": [T + "test_a_stream_that_gives_nothing_is_refused_before_training"],
        "why": "a stream that gives no batch at all ends the run silently, nothing trained",
    },
    {
        "file": RUN,
        "find": "        short = options.max_steps is not None and not at.reached_max(state.step)",
        "replace": "        short = False",
        "tests": [T + "test_max_steps_ends_an_endless_stream_and_a_stream_that_ends_first_says_so"],
        "why": "a stream that ends before max_steps ends the run without saying so",
    },
    {
        "file": RUN,
        "find": "        done = at.epoch + (at.position == self.per_epoch or at.ended)",
        "replace": "        done = at.epoch + (at.position == self.per_epoch)",
        "tests": [T + "test_each_pass_is_an_epoch_begun_with_set_epoch_and_ended_saved"],
        "why": "the record at a pass's end numbers the epoch before it",
    },
    {
        "file": "src/composetrain/driver/progress.py",
        "find": "        return Due(bool(self.window), True, not self.schedule.eval_every, True)",
        "replace": "        return Due(bool(self.window), False, not self.schedule.eval_every, True)",
        "tests": [T + "test_each_pass_is_an_epoch_begun_with_set_epoch_and_ended_saved"],
        "why": "a pass's end is not saved: the run's last pass, finished, is trained again when it is rerun",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": 'settings.get("stream") not in (None, "global state"):',
        "replace": 'settings.get("stream") not in (None, "global state", "state"):',
        "tests": [TR + "test_a_stream_resumes_on_another_number_of_processes_only_where_its_state_is_the_jobs"],
        "why": "a stream's per-rank state resumes on another world size: rank 0's state read by every rank",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "        if self.shuffle:\n",
        "replace": "        if False:\n",
        "tests": [T + "test_what_a_stream_cannot_take_is_refused_with_the_fix"],
        "why": "shuffle=True with a stream is ignored, not refused",
    },
]
