# ruff: noqa: E501
"""Planted bugs for the run adversary's findings (issue 29: ct.run's checkpoints and trackers)."""

SHARDED = "tests/test_sharded_checkpoint_files.py"
TRUST = "tests/test_checkpoint_trust.py"
TRACKER = "tests/test_run_tracker.py"
HOSTILE = "tests/test_run_tracker.py"
LR = "tests/test_run_lr.py"

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": '            names = sorted(f"{SHARDS}/{p.name}" for p in found.iterdir()) if found.is_dir() and sums else []\n',
        "replace": '            names = sorted(n for n in sums or {} if n.startswith(f"{SHARDS}/"))\n',
        "tests": [
            f"{SHARDED}::test_a_flipped_shard_file_whose_checksum_is_missing_from_the_list_is_corrupt_too",
            f"{SHARDED}::test_a_checksum_list_naming_files_outside_the_checkpoint_reads_none_of_them",
        ],
        "why": "the shards checked are those checksums.json names: an entry lost lets a flipped shard load, shards/../x is read",
    },
    {
        "file": "src/composetrain/checkpoint/checksums.py",
        "find": "    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:",
        "replace": "    except (OSError, ValueError, KeyError, TypeError) as e:",
        "tests": [f"{TRUST}::test_a_checksum_list_nested_too_deep_for_json_is_a_corrupt_checkpoint"],
        "why": "a checksums.json of [[[[... raises RecursionError out of ct.run instead of being a corrupt checkpoint",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "        self.records.send(record)\n        self._append(record)\n        if self.board is not None:\n            self._board_train(record)\n",
        "replace": "        self._append(record)\n        self.records.send(record)\n        if self.board is not None:\n            self._board_train(record)\n",
        "tests": [f"{TRACKER}::test_a_run_killed_inside_the_trackers_call_sends_that_record_again_and_loses_none"],
        "why": "the line before the tracker's call: a process killed inside the call loses the record for good",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            pairs = [p for p in earlier if type(p) is list and len(p) == 2]\n",
        "replace": "            pairs = earlier\n",
        "tests": [f"{HOSTILE}::test_a_damaged_list_of_sent_records_is_read_as_far_as_it_holds_pairs"],
        "why": "a damaged .metrics.jsonl.sent ([[5, true, 1]], [5]) raises ValueError/TypeError after the resume",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            except (ValueError, RecursionError):  # a line cut short by a crash: sent again (its call returned)\n",
        "replace": "            except ValueError:\n",
        "tests": [f"{HOSTILE}::test_a_metrics_line_nested_too_deep_for_json_counts_as_cut_short"],
        "why": "a metrics line of [[[[... raises RecursionError out of ct.run on resume",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "    if os.path.isdir(kept) and not os.path.islink(kept):\n",
        "replace": "    if False:\n",
        "tests": [f"{HOSTILE}::test_a_list_of_sent_records_that_is_a_folder_is_refused_before_anything_resumes"],
        "why": "a folder where .metrics.jsonl.sent goes fails with a bare IsADirectoryError after the state was loaded",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '    if any(getattr(s, "cycle_momentum", False) is True for s in inner):\n',
        "replace": "    if state.scheduler is not None:\n",
        "tests": [f"{LR}::test_settings_given_to_a_resumed_run_that_the_checkpoint_replaces_are_named"],
        "why": "a new momentum given to a resumed run under StepLR/CosineAnnealingLR is silently replaced by the checkpoint's",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "        if aside:  # every checkpoint of this run is corrupt",
        "replace": "        if False:  # every checkpoint of this run is corrupt",
        "tests": [
            "tests/test_checkpoint_loading.py::test_with_every_checkpoint_corrupt_the_run_is_refused_not_started_afresh"
        ],
        "why": "lead's fix: every checkpoint corrupt, and the run starts over from its first update with a warning",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": 'sorted(p.name for p in self.dir.glob("corrupt-step-*"))',
        "replace": "[]",
        "tests": [
            "tests/test_checkpoint_loading.py::test_with_every_checkpoint_corrupt_the_run_is_refused_not_started_afresh"
        ],
        "why": "lead's fix: only this launch's set-aside folders count, so the next launch starts over",
    },
]
