"""The planted bugs of src/composetrain/driver/streams.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/streams.py",
        "find": "        if self.loader is not None and not self.opened and has_state(self.dataset):",
        "replace": "        if False:",
        "tests": [
            "tests/test_streams_torchdata.py::test_loader_workers_start_after_set_epoch_also_when_checkpoints_are_saved",
        ],
        "why": "the check before the first update starts the loader's workers before set_epoch(0)",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": 'derive_seed(self.seed, "stream pass", rank=self.rank, epoch=self.epoch)',
        "replace": 'derive_seed(self.seed, "stream pass", rank=self.rank)',
        "tests": [
            "tests/test_streams_torchdata.py::test_a_pass_read_by_workers_ct_run_builds_draws_alike_in_a_resumed_run",
        ],
        "why": "every pass's workers seeded alike: each pass's noise repeats the first pass's",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": 'if getattr(data, "in_order", True) is False and data.num_workers > 1:',
        "replace": 'if getattr(data, "in_order", True) is False and data.num_workers > 2:',
        "tests": [
            "tests/test_streams_torchdata.py::test_a_stateful_dataloader_out_of_order_is_refused_with_checkpoints",
        ],
        "why": "two workers out of order are let through: a resume trains on other batches",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": "            self.ended = len(batch) < self.batch_size\n",
        "replace": "            self.ended = False\n",
        "tests": [
            "tests/test_streams.py::test_a_stream_that_starts_over_at_its_end_resumes_after_its_short_last_batch",
        ],
        "why": (
            "the end seen inside the last, short batch is not recorded: a stream that starts over at its end is "
            "read again in the same pass after a resume there"
        ),
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": "            if not batch or (self.ended and self.drop_last):",
        "replace": "            if not batch:",
        "tests": [
            "tests/test_streams.py::test_drop_last_drops_the_passes_short_batch",
        ],
        "why": "drop_last ignored: the pass's short batch is trained on",
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": ("    try:\n        return make()\n    finally:\n        restore_rng(states)"),
        "replace": "    return make()",
        "tests": [
            "tests/test_streams_torchdata.py::test_a_given_stateful_dataloader_resumes_three_times_across_a_pass_end",
        ],
        "why": (
            "a given loader's new iterator draws its base seed from the global generator: a resume draws it at "
            "another update, and the dropout masks after it differ"
        ),
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": "        if not has_state(data.dataset):",
        "replace": "        if False:",
        "tests": [
            "tests/test_streams_torchdata.py::test_a_stateful_dataloader_over_a_stream_without_state_is_refused_with_checkpoints",
        ],
        "why": "a StatefulDataLoader over a stream without state is taken: its resume re-reads every batch",
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": "    return unplain(state, where)",
        "replace": "    return None",
        "tests": [
            "tests/test_streams.py::test_a_state_dict_no_checkpoint_could_hold_is_refused_before_training",
        ],
        "why": "a state no weights-only checkpoint can hold is found only at the first save, after training to it",
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/streams.py",
        "find": 'and getattr(data, "state_is_global", False) is True',
        "replace": 'and getattr(data, "state_is_global", False) is None',
        "tests": [
            "tests/test_streams_ranks.py::test_a_stream_resumes_on_another_number_of_processes_only_where_its_state_is_the_jobs",
        ],
        "why": "the declaration state_is_global is ignored: its checkpoints never resume on another world size",
        "from": "streams",
    },
]
