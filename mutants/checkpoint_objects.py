"""The planted bugs of src/composetrain/checkpoint/objects.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/objects.py",
        "find": "        for rank in range(self.world_size) if self.world_size > 1 else ():",
        "replace": "        for rank in ():",
        "tests": [
            "tests/test_checkpoint_objects.py::test_two_ranks_save_into_one_checkpoint_in_s3_and_sharded_states_are_refused",
        ],
        "why": "in object storage the ranks' marks stay under the published checkpoint's prefix",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/checkpoint/objects.py",
        "find": "|{SHARDS}/.+|\\.written-rank-[0-9]+)",
        "replace": "|{SHARDS}/.+)",
        "tests": [
            "tests/test_checkpoint_objects.py::test_an_upload_of_several_ranks_cut_short_with_their_marks_is_tidied_by_the_next_run",
        ],
        "why": (
            "a mark left by an upload cut short is taken for the user's object: the next run refuses to save there"
        ),
        "from": "adv35",
    },
    {
        "file": "src/composetrain/checkpoint/objects.py",
        "find": "        self._erase(flush.tmp)  # what an earlier try left",
        "replace": (
            "        self._erase(flush.tmp)\n            self._put_marker(flush.tmp, {})  # what an earlier try left"
        ),
        "tests": [
            "tests/test_checkpoint_objects.py::test_a_run_in_s3_saves_in_the_background_publishes_by_a_marker_written_last_and_resumes",
        ],
        "why": "the marker before the files: a checkpoint is published before its objects are uploaded",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/objects.py",
        "find": '        return final, (self.dir / f".step-{step:09d}.tmp" if self._complete(final) else final)',
        "replace": "        return final, final",
        "tests": [
            "tests/test_checkpoint_objects.py::test_a_step_saved_again_replaces_the_published_one_without_ever_leaving_none",
        ],
        "why": (
            "a step saved again is written over the published one in place: a kill meanwhile leaves no checkpoint of it"
        ),
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/objects.py",
        "find": "                    self._replace(place, final, self._sums(place))",
        "replace": "                    self._erase(place)",
        "tests": [
            "tests/test_checkpoint_objects.py::test_a_step_saved_again_replaces_the_published_one_without_ever_leaving_none",
        ],
        "why": (
            "a replacement cut short is not finished by the next run: the complete new copy is thrown away, the "
            "step lost"
        ),
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/objects.py",
        "find": ('        if self._complete(place):\n            io_step(f"remove {place.name}/{CHECKSUMS}")'),
        "replace": ('        if False:\n            io_step(f"remove {place.name}/{CHECKSUMS}")'),
        "tests": [
            "tests/test_checkpoint_objects.py::test_a_step_saved_again_replaces_the_published_one_without_ever_leaving_none",
        ],
        "why": (
            "retention and tidying remove objects before the marker: a checkpoint that lost files still looks complete"
        ),
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/objects.py",
        "find": '                self._call("write of", probe, self.fs.pipe_file, probe.path, b"")\n',
        "replace": "",
        "tests": [
            "tests/test_checkpoint_objects.py::test_a_store_that_cannot_be_written_is_refused_before_anything_is_trained",
        ],
        "why": (
            "the store is not tried at the start: an unreachable endpoint or missing bucket is found after training"
        ),
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/objects.py",
        "find": (
            "            if flush.tmp != flush.final and self._complete(flush.tmp) and not "
            "self._complete(flush.final):\n"
            "                return"
        ),
        "replace": ("            if False:\n                return"),
        "tests": [
            "tests/test_checkpoint_objects.py::test_a_step_saved_again_replaces_the_published_one_without_ever_leaving_none",
        ],
        "why": "a failed replacement discards the only complete copy of the step",
        "from": "checkpoint_async",
    },
]
