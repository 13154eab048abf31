"""The planted bugs of src/composetrain/checkpoint/files.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "        deadline = min(deadline, now + MARKS_GRACE + 4 * (now - self._began))",
        "replace": "        deadline = min(deadline, now + self.timeout)",
        "tests": [
            "tests/test_checkpoint_async.py::test_two_ranks_failing_with_a_save_in_flight_publish_it_once_both_wrote_it_and_never_agree_on_it",
        ],
        "why": "a failed run's rank 0 waits the whole timeout for a dead rank's part: the job's restart held 300 s",
        "from": "ci",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "        elif written and self.rank == 0 and self._writer.outcome()[1] is None:",
        "replace": "        elif False and written and self.rank == 0 and self._writer.outcome()[1] is None:",
        "tests": [
            "tests/test_checkpoint_async.py::test_two_ranks_failing_with_a_save_in_flight_publish_it_once_both_wrote_it_and_never_agree_on_it",
            "tests/test_streams_ranks.py::test_a_stream_raising_on_one_rank_fails_every_rank_and_keeps_the_last_checkpoint",
        ],
        "why": "several ranks give a failed run's save in flight up, the last checkpoint a synchronous save had",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "            if self.world_size > 1:  # this rank's part told in the folder",
        "replace": "            if self.world_size > 2:  # this rank's part told in the folder",
        "tests": [
            "tests/test_checkpoint_async.py::test_two_ranks_failing_with_a_save_in_flight_publish_it_once_both_wrote_it_and_never_agree_on_it",
        ],
        "why": "no marks on two ranks: rank 0 waits its timeout for them, then gives the save up",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": ("  # that rank's writes failed: nothing to publish\n                        return None\n"),
        "replace": ("  # that rank's writes failed: nothing to publish\n                        continue\n"),
        "tests": [
            "tests/test_checkpoint_async.py::test_two_ranks_failing_with_a_save_in_flight_publish_it_once_both_wrote_it_and_never_agree_on_it",
        ],
        "why": "a rank's failed writes not heeded: rank 0 waits out its whole timeout for a part that never comes",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "            if len(parts) == self.world_size:",
        "replace": "            if len(parts) >= self.world_size - 1:",
        "tests": [
            "tests/test_checkpoint_async.py::test_two_ranks_failing_with_a_save_in_flight_publish_it_once_both_wrote_it_and_never_agree_on_it",
        ],
        "why": "published without every rank's part: a checkpoint missing a rank's file, listed as complete",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "        deadline = time.monotonic() + self.timeout",
        "replace": "        deadline = time.monotonic() + 3 * self.timeout",
        "tests": [
            "tests/test_checkpoint_async.py::test_two_ranks_failing_with_a_save_in_flight_publish_it_once_both_wrote_it_and_never_agree_on_it",
        ],
        "why": "a rank that died mid-write holds the others past the timeout the user gave",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": '    return json.dumps({"sha256": sums} if failed is None else {"failed": failed})',
        "replace": '    return json.dumps({"sha256": sums})',
        "tests": [
            "tests/test_checkpoint_async.py::test_two_ranks_failing_with_a_save_in_flight_publish_it_once_both_wrote_it_and_never_agree_on_it",
        ],
        "why": "a rank whose writes failed marks its part written: rank 0 publishes a checkpoint without its file",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "            mark.unlink(missing_ok=True)",
        "replace": "            pass",
        "tests": [
            "tests/test_checkpoint_async.py::test_two_ranks_failing_with_a_save_in_flight_publish_it_once_both_wrote_it_and_never_agree_on_it",
        ],
        "why": "the ranks' marks left in the published checkpoint, files it does not list",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": (
            "        self._seal(flush, sums)\n        self._commit(flush, sums)\n        self._prune(flush.step)\n"
        ),
        "replace": ("        self._seal(flush, sums)\n        self._commit(flush, sums)\n"),
        "tests": [
            "tests/test_checkpoint_async.py::test_two_ranks_failing_with_a_save_in_flight_publish_it_once_both_wrote_it_and_never_agree_on_it",
        ],
        "why": "a save published by rank 0 alone keeps more checkpoints than keep_checkpoints",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": '                    problem = problem or (local and unlogged_problem(payload, local["window"]))',
        "replace": "                    problem = problem",
        "tests": [
            "tests/test_global_batch.py::test_a_checkpoint_whose_unlogged_updates_do_not_add_up_is_set_aside",
        ],
        "why": "the rank file's window unchecked: a resume on the same number continues a wrong record",
        "from": "adversary32",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "if failure.errno in (errno.ENOSPC, errno.EDQUOT):",
        "replace": "if failure.errno == errno.EDQUOT:",
        "tests": [
            "tests/test_checkpoint_folder.py::test_a_full_disk_during_a_save_says_so_and_leaves_the_previous_checkpoint",
        ],
        "why": "a full disk (ENOSPC) not named as one",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": (
            "    def _discard(self, flush: Flush) -> None:\n        shutil.rmtree(flush.tmp, ignore_errors=True)\n"
        ),
        "replace": ("    def _discard(self, flush: Flush) -> None:\n        pass\n"),
        "tests": [
            "tests/test_checkpoint_folder.py::test_a_full_disk_during_a_save_says_so_and_leaves_the_previous_checkpoint",
        ],
        "why": "a failed save leaves its half-written temporary folder behind on the full disk",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "        if not all_true(nonfinite is None):\n",
        "replace": "        if nonfinite is not None:\n",
        "tests": [
            "tests/test_checkpoint_trust.py::test_every_rank_refuses_the_save_when_one_rank_diverged",
        ],
        "why": (
            "29.11: each rank decides alone: the finite ranks save (or hang in the save's collectives) while one "
            "refuses"
        ),
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "        problem = problem or mismatch(path, name, sums)\n",
        "replace": "",
        "tests": [
            "tests/test_checkpoint_trust.py::test_a_flipped_bit_in_a_checkpoint_file_is_found_and_the_previous_checkpoint_resumes",
        ],
        "why": "29.12: checksums written but never verified: a flipped bit loads silently",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "            flush.written[name] = self._write_file(flush, name, value)\n",
        "replace": (
            "            sum_ = self._write_file(flush, name, value)\n"
            "            if name == STATE_FILE:\n"
            "                flush.written[name] = sum_\n"
        ),
        "tests": [
            "tests/test_checkpoint_trust.py::test_a_flipped_bit_in_a_checkpoint_file_is_found_and_the_previous_checkpoint_resumes",
        ],
        "why": "29.12: the rank files have no checksum: every checkpoint is set aside as corrupt",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": '        if value is not None and name == STATE_FILE and sums is None and value["format"] >= 3:',
        "replace": "        if False:",
        "tests": [
            "tests/test_checkpoint_trust.py::test_a_checkpoint_of_format_2_loads_without_checksums_and_one_of_format_3_needs_them",
        ],
        "why": "29.12: deleting checksums.json turns verification off for a new checkpoint",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": (
            '            names = sorted(f"{SHARDS}/{p.name}" for p in found.iterdir()) if found.is_dir() and '
            "sums else []"
        ),
        "replace": (
            '            names = sorted(f"{SHARDS}/{p.name}" for p in found.glob(".*")) if found.is_dir() and '
            "sums else []"
        ),
        "tests": [
            "tests/test_sharded_checkpoint_files.py::test_a_flipped_bit_in_a_shard_file_is_found_by_its_checksum",
        ],
        "why": "29.12: the shard data files left unverified (only the metadata checked)",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": (
            '            names = sorted(f"{SHARDS}/{p.name}" for p in found.iterdir()) if found.is_dir() and '
            "sums else []\n"
        ),
        "replace": '            names = sorted(n for n in sums or {} if n.startswith(f"{SHARDS}/"))\n',
        "tests": [
            "tests/test_sharded_checkpoint_files.py::test_a_flipped_shard_file_whose_checksum_is_missing_from_the_list_is_corrupt_too",
            "tests/test_sharded_checkpoint_files.py::test_a_checksum_list_naming_files_outside_the_checkpoint_reads_none_of_them",
        ],
        "why": (
            "the shards checked are those checksums.json names: an entry lost lets a flipped shard load, "
            "shards/../x is read"
        ),
        "from": "issue29_x_run",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "        if aside:  # every checkpoint of this run is corrupt",
        "replace": "        if False:  # every checkpoint of this run is corrupt",
        "tests": [
            "tests/test_checkpoint_loading.py::test_with_every_checkpoint_corrupt_the_run_is_refused_not_started_afresh",
        ],
        "why": "lead's fix: every checkpoint corrupt, and the run starts over from its first update with a warning",
        "from": "issue29_x_run",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": 'sorted(p.name for p in self.dir.glob("corrupt-step-*"))',
        "replace": "[]",
        "tests": [
            "tests/test_checkpoint_loading.py::test_with_every_checkpoint_corrupt_the_run_is_refused_not_started_afresh",
        ],
        "why": "lead's fix: only this launch's set-aside folders count, so the next launch starts over",
        "from": "issue29_x_run",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "                mine = same_ranks(payload, self.world_size, self.data_shards)\n",
        "replace": '                mine = payload["world_size"] >= self.world_size\n',
        "tests": [
            "tests/test_resume_anywhere.py::test_a_chain_of_runs_on_2_1_3_2_processes_ends_as_the_uninterrupted_run",
        ],
        "why": "a shrink reads the ranks' own files as if the job were the same: rank 0's streams and window alone",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "                mine = same_ranks(payload, self.world_size, self.data_shards)\n",
        "replace": '                mine = payload["world_size"] == self.world_size\n',
        "tests": [
            "tests/test_meshes.py::test_a_global_batch_run_splits_it_over_data_shards_and_resumes_on_another_mesh",
        ],
        "why": (
            "a rank's own file restored on another layout of as many processes: a TP pair resumes with two "
            "shards' random streams"
        ),
        "from": "meshes",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": ("        self._writer.wait()\n        self._pending = None\n"),
        "replace": "        self._pending = None\n",
        "tests": [
            "tests/test_checkpoint_async.py::test_finish_and_the_next_save_wait_for_the_writes_in_flight",
        ],
        "why": "published before durable: finish reads the writer's outcome without waiting for its writes",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": ("        self._fail_if(flush, failure)\n        return self._publish(flush, gathered(written))"),
        "replace": "        return self._publish(flush, gathered(written or {}))",
        "tests": [
            "tests/test_checkpoint_async.py::test_a_full_disk_in_the_background_stops_the_run_and_leaves_the_previous_checkpoint",
        ],
        "why": "a background write that failed (a full disk) is published with the files it has, its error dropped",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": ("        os.fsync(f.fileno())\n    return hashing.hexdigest()"),
        "replace": "    return hashing.hexdigest()",
        "tests": [
            "tests/test_checkpoint.py::test_every_file_and_folder_is_fsynced_before_one_rename_creates_the_checkpoint",
        ],
        "why": "published before durable: a file written in the background is never fsynced before the rename",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": ('waits for its writes)."""\n        self.finish()\n'),
        "replace": 'waits for its writes)."""\n',
        "tests": [
            "tests/test_checkpoint_async.py::test_finish_and_the_next_save_wait_for_the_writes_in_flight",
        ],
        "why": "two saves in flight: save_async starts the next without finishing the one being written",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "        older = [p for p in self._steps() if self._step(p) < step]",
        "replace": "        older = [p for p in self._steps() if self._step(p) <= step]",
        "tests": [
            "tests/test_checkpoint_async.py::test_retention_never_leaves_the_folder_without_a_complete_checkpoint",
        ],
        "why": (
            "retention counts the checkpoint just published among the old ones: keep_checkpoints=1 deletes the newest"
        ),
        "from": "checkpoint_async",
    },
]
