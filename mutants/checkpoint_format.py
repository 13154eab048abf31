"""The planted bugs of src/composetrain/checkpoint/format.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": "READS = (2, 3)",
        "replace": "READS = (3,)",
        "tests": [
            "tests/test_checkpoint_trust.py::test_a_checkpoint_of_format_2_loads_without_checksums_and_one_of_format_3_needs_them",
        ],
        "why": "29.12: checkpoints written before checksums are refused",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": 'and settings.get("global_batch_size") is None and not settings.get("stream"):',
        "replace": 'and settings.get("batch_size") is None and not settings.get("stream"):',
        "tests": [
            "tests/test_resume_anywhere.py::test_what_cannot_be_exact_is_refused_before_anything_changes",
        ],
        "why": "the world-size check reads the wrong setting: a batch_size checkpoint resumes on another W",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": 'if payload["world_size"] != world_size and settings.get("global_batch_size")',
        "replace": 'if payload["world_size"] < world_size and settings.get("global_batch_size")',
        "tests": [
            "tests/test_checkpoint_folder.py::test_a_checkpoint_of_two_processes_is_refused_in_one_and_kept",
        ],
        "why": "20.10: a checkpoint of more processes than the run has is resumed",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": 'settings.get("stream") not in (None, "global state"):',
        "replace": 'settings.get("stream") not in (None, "global state", "state"):',
        "tests": [
            "tests/test_streams_ranks.py::test_a_stream_resumes_on_another_number_of_processes_only_where_its_state_is_the_jobs",
        ],
        "why": "a stream's per-rank state resumes on another world size: rank 0's state read by every rank",
        "from": "streams",
    },
]
