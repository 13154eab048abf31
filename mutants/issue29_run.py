# ruff: noqa: E501
"""Planted bugs for issue 29 items 9-12 and its unclear items, issue 30 item 6 (the driver and checkpoints)."""

TRACKER = "tests/test_run_tracker.py"
TRUST = "tests/test_checkpoint_trust.py"
SHARDED = "tests/test_sharded_checkpoint_files.py"
EPOCHS = "tests/test_epoch_schedules.py"
LR = "tests/test_run_lr.py"
FOLDER = "tests/test_checkpoint_folder.py"
LOOP = "tests/test_run_loop.py"

MUTANTS = [
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "            self.sent.update((s, e) for s, e in pairs if type(s) is int and type(e) is bool)\n",
        "replace": "            pass\n",
        "tests": [
            f"{TRACKER}::test_any_number_of_crashes_at_any_updates_sends_each_record_once",
            f"{TRACKER}::test_each_record_reaches_the_tracker_once_across_runs_killed_again_and_again",
        ],
        "why": "29.9: what earlier resumed runs found sent is forgotten: a second kill sends the records again",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "self.sent = {(s, e) for s, e in self.sent if s >= step}",
        "replace": "self.sent = {(s, e) for s, e in self.sent if s > step}",
        "tests": [
            f"{TRACKER}::test_any_number_of_crashes_at_any_updates_sends_each_record_once",
            f"{TRACKER}::test_after_a_crash_the_redone_updates_do_not_send_their_records_again",
        ],
        "why": "29.9: the evaluation at the checkpoint's own step (redone on resume) is dropped from what was sent",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "            self.records.forget(self.path)  # what the run moved aside had sent is no concern of this one\n",
        "replace": "",
        "tests": [
            f"{TRACKER}::test_a_fresh_start_forgets_the_list_of_sent_records_of_the_run_whose_metrics_it_moved_aside"
        ],
        "why": "29.9: a fresh run whose metrics file was moved aside keeps the old run's list of sent records",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "    return next((n for (n, _), ok in zip(named, finite.tolist(), strict=True) if not ok), None)",
        "replace": "    return None",
        "tests": [f"{TRUST}::test_a_diverged_model_is_never_saved_and_the_finite_checkpoints_stay"],
        "why": "29.11: no finiteness check: NaN weights saved, the finite checkpoints pruned",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "        if not all_true(nonfinite is None):\n",
        "replace": "        if nonfinite is not None:\n",
        "tests": [f"{TRUST}::test_every_rank_refuses_the_save_when_one_rank_diverged"],
        "why": "29.11: each rank decides alone: the finite ranks save (or hang in the save's collectives) while one refuses",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "    named = [(n, p) for n, p in named if p.is_floating_point() or p.is_complex()]",
        "replace": "    named = [(n, p) for n, p in named if p.is_floating_point() or p.is_complex()]\n    named += [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]",
        "tests": [f"{TRUST}::test_an_inf_buffer_is_no_divergence"],
        "why": "29.11: buffers checked too: a mask of -inf refuses every save",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "            problem = problem or mismatch(path, name, sums)\n",
        "replace": "",
        "tests": [f"{TRUST}::test_a_flipped_bit_in_a_checkpoint_file_is_found_and_the_previous_checkpoint_resumes"],
        "why": "29.12: checksums written but never verified: a flipped bit loads silently",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "            written[rank_file(self.rank)] = digest(tmp / rank_file(self.rank))\n",
        "replace": "",
        "tests": [f"{TRUST}::test_a_flipped_bit_in_a_checkpoint_file_is_found_and_the_previous_checkpoint_resumes"],
        "why": "29.12: the rank files have no checksum: every checkpoint is set aside as corrupt",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": '            if value is not None and name == STATE_FILE and sums is None and value["format"] >= 3:',
        "replace": "            if False:",
        "tests": [f"{TRUST}::test_a_checkpoint_of_format_2_loads_without_checksums_and_one_of_format_3_needs_them"],
        "why": "29.12: deleting checksums.json turns verification off for a new checkpoint",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": '            names = sorted(f"{SHARDS}/{p.name}" for p in found.iterdir()) if found.is_dir() and sums else []',
        "replace": '            names = sorted(f"{SHARDS}/{p.name}" for p in found.glob(".*")) if found.is_dir() and sums else []',
        "tests": [f"{SHARDED}::test_a_flipped_bit_in_a_shard_file_is_found_by_its_checksum"],
        "why": "29.12: the shard data files left unverified (only the metadata checked)",
    },
    {
        "file": "src/composetrain/checkpoint/loading.py",
        "find": "    problem = problem or mismatch(folder, STATE_FILE, sums)\n",
        "replace": "",
        "tests": [f"{TRUST}::test_load_checkpoint_refuses_a_flipped_bit"],
        "why": "29.12: ct.load_checkpoint never verifies",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": "READS = (2, 3)",
        "replace": "READS = (3,)",
        "tests": [f"{TRUST}::test_a_checkpoint_of_format_2_loads_without_checksums_and_one_of_format_3_needs_them"],
        "why": "29.12: checkpoints written before checksums are refused",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            at = d.resume(schedule, options.loader.seed)\n            d.refuse_in_the_way(schedule, state.step)  # before training, not after it\n            _check_horizon(state, schedule, at.resumed)",
        "replace": "            _check_horizon(state, schedule, False)\n            at = d.resume(schedule, options.loader.seed)\n            d.refuse_in_the_way(schedule, state.step)  # before training, not after it",
        "tests": [f"{EPOCHS}::test_a_finished_run_continued_for_more_epochs_is_warned_about_the_schedule_it_restored"],
        "why": "29.10: the horizon checked on the given scheduler, before the checkpoint's replaces it",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "    ends = schedule.epochs - at.epoch if schedule.epochs is not None else None",
        "replace": "    ends = schedule.epochs if schedule.epochs is not None else None",
        "tests": [f"{EPOCHS}::test_a_one_cycle_schedule_of_exactly_the_runs_epochs_resumes_part_way"],
        "why": "30.6: the epochs already done are counted again against the OneCycleLR's steps left: a resume refused",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '    changed = [f"{k} {restored[k]!r} (given {v!r})" for k, v in given.items() if k in restored and restored[k] != v]',
        "replace": "    changed = [f\"{k} {restored[k]!r} (given {v!r})\" for k, v in given.items() if k in restored and restored[k] != v and 'lr' not in k]",
        "tests": [f"{LR}::test_settings_given_to_a_resumed_run_that_the_checkpoint_replaces_are_named"],
        "why": "29 unclear: a new lr given on resume silently ignored",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '    scheduled = set() if state.scheduler is None else {"lr"}',
        "replace": "    scheduled = set()",
        "tests": [f"{LR}::test_a_resume_with_the_same_settings_says_nothing_though_the_schedule_moved_the_rates"],
        "why": "29 unclear: the scheduled lr compared: every resume under a scheduler warns",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "lambda n: start < n <= last and (n == last or n % schedule.per_epoch == 0 or bool(every and n % every == 0))",
        "replace": "lambda n: start < n <= last and (n == last or bool(every and n % every == 0))",
        "tests": [f"{FOLDER}::test_a_folder_without_state_pt_where_the_run_saves_is_refused_before_training"],
        "why": "29 unclear: a folder at an epoch end's save is found only after training up to it",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        done = at.epoch + (at.position == self.per_epoch)",
        "replace": "        done = at.epoch",
        "tests": [f"{LOOP}::test_log_and_evaluation_records_number_the_epoch_alike"],
        "why": "29 unclear: the log record at an epoch's end numbers the epoch unlike its evaluation",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "        except (Exception, KeyboardInterrupt, SystemExit) as e:",
        "replace": "        except Exception as e:",
        "tests": [
            f"{TRACKER}::test_a_tracker_raising_keyboardinterrupt_or_systemexit_stops_the_run_saved_and_raises_it"
        ],
        "why": "29 unclear: a tracker's KeyboardInterrupt ends the run unsaved",
    },
    {
        "file": "src/composetrain/driver/tracking.py",
        "find": "        if self.on_record is None or seconds < 0.5 * timeout:",
        "replace": "        if self.on_record is None or seconds < 5 * timeout:",
        "tests": [f"{TRACKER}::test_a_tracker_blocking_past_the_timeout_on_two_ranks_is_named_by_both"],
        "why": "29 unclear: rank 0's error blames a hung rank, not its slow tracker",
    },
]
