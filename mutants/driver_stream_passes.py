"""The planted bugs of src/composetrain/driver/stream_passes.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/stream_passes.py",
        "find": 'return stream.record(state), {"state": state, "ended": any_true(stream.ended) if inside else False}',
        "replace": 'return stream.record(state), {"state": state, "ended": False}',
        "tests": [
            "tests/test_streams_ranks.py::test_a_global_stream_saved_after_its_last_short_batch_resumes_on_another_number_of_processes_at_the_pass_end",
        ],
        "why": "on another world size, a global stream that starts over by itself is read again in the pass it ended",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/driver/stream_passes.py",
        "find": "batches = _raising(e)",
        "replace": "raise",
        "tests": [
            "tests/test_streams_ranks.py::test_a_stream_failing_in_iter_set_epoch_or_set_rank_on_one_rank_fails_every_rank_at_once",
        ],
        "why": "an iter() or set_epoch raising on one rank leaves the others at the next collective (a hang)",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/driver/stream_passes.py",
        "find": "        agreed = int(largest([float(status)])[0]) if proc.world_size > 1 else status",
        "replace": "        agreed = status",
        "tests": [
            "tests/test_streams_ranks.py::test_ranks_whose_streams_end_at_different_updates_stop_together",
        ],
        "why": (
            "each rank decides alone whether it has a batch: a rank whose stream ended leaves the others in "
            "DDP's all-reduce (a hang until the timeout)"
        ),
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/stream_passes.py",
        "find": "    same = [r for r, d in enumerate(digests) if digests.count(d) > 1]",
        "replace": "    same = [r for r, d in enumerate(digests) if digests.count(d) > 2]",
        "tests": [
            "tests/test_streams_ranks.py::test_two_ranks_reading_the_same_share_are_refused_before_training",
        ],
        "why": "two ranks reading the same share go unseen: they train on the same data",
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/stream_passes.py",
        "find": ("        if position == 0 or replay:\n            stream.set_epoch(epoch)"),
        "replace": ("        if position == 0:\n            stream.set_epoch(epoch)"),
        "tests": [
            "tests/test_streams.py::test_a_stream_without_state_is_refused_with_checkpoints_and_resumed_by_replay_when_asked",
        ],
        "why": "a replayed pass is read without its set_epoch: a later pass replays the first one's items",
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/stream_passes.py",
        "find": "        read = sum(1 for _ in itertools.islice(batches, position))",
        "replace": "        read = sum(1 for _ in itertools.islice(batches, position - 1)) + 1",
        "tests": [
            "tests/test_streams.py::test_a_stream_without_state_is_refused_with_checkpoints_and_resumed_by_replay_when_asked",
        ],
        "why": "the replay drops one batch too few: the last batch before the checkpoint is trained on twice",
        "from": "streams",
    },
]
