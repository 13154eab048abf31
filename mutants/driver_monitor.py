"""The planted bugs of src/composetrain/driver/monitor.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "from composetrain.data.kinds import as_hdf5, as_mapped, augmented_inside\n",
        "replace": (
            "from composetrain.data.hdf5 import HDF5Dataset as _H\n"
            "from composetrain.data.kinds import as_hdf5, as_mapped, augmented_inside\n"
        ),
        "tests": [
            "tests/test_lazy_package.py::test_without_numpy_ct_run_trains_and_only_the_data_layers_names_need_it",
        ],
        "why": "the driver imports the data layer (and NumPy) for a run over other data",
        "from": "integration",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "            now[0] - self.window_compiled[0],\n",
        "replace": "            now[0] - self.compiled_before[0],\n",
        "tests": [
            "tests/test_compile_run.py::test_records_count_compilations_and_their_time_and_the_bottleneck_names_them",
        ],
        "why": "23.10: the records count compilations since the run began, not in their window",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "if count and seconds > 0.2 * self.computed:",
        "replace": "if count and seconds > 2 * self.computed:",
        "tests": [
            "tests/test_compile_run.py::test_records_count_compilations_and_their_time_and_the_bottleneck_names_them",
        ],
        "why": "23.11: the bottleneck never names compile time (it cannot exceed the step's time)",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "if run_compiles > 0:",
        "replace": "if run_compiles >= 0:",
        "tests": [
            "tests/test_compile_run.py::test_records_count_compilations_and_their_time_and_the_bottleneck_names_them",
        ],
        "why": "23.12: eager runs' records gain compile fields",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": 'record["compile_s"] = compile_s',
        "replace": 'record["compile_s"] = compiled[1]',
        "tests": [
            "tests/test_compile.py::test_under_ct_run_every_rank_logs_the_same_compile_record",
        ],
        "why": "23.17: each rank logs its own compile seconds: the ranks' records differ",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "Records(on_record if proc.is_main else None)",
        "replace": "Records(on_record)",
        "tests": [
            "tests/test_run_tracker.py::test_on_rank_zero_only",
        ],
        "why": "24.5: every rank calls its tracker: each record sent once per rank",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "            self.records.resume(found, self.path, step)",
        "replace": "            pass",
        "tests": [
            "tests/test_run_tracker.py::test_after_a_crash_the_redone_updates_do_not_send_their_records_again",
        ],
        "why": "24.5: a resumed run sends again the records the interrupted run sent after its checkpoint",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": (
            "            self.records.forget(self.path)  # what the run moved aside had sent is no concern of "
            "this one\n"
        ),
        "replace": "",
        "tests": [
            "tests/test_run_tracker.py::test_a_fresh_start_forgets_the_list_of_sent_records_of_the_run_whose_metrics_it_moved_aside",
        ],
        "why": "29.9: a fresh run whose metrics file was moved aside keeps the old run's list of sent records",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": (
            "        self.records.send(record)\n"
            "        self._append(record)\n"
            "        if self.board is not None:\n"
            "            self._board_train(record)\n"
        ),
        "replace": (
            "        self._append(record)\n"
            "        self.records.send(record)\n"
            "        if self.board is not None:\n"
            "            self._board_train(record)\n"
        ),
        "tests": [
            "tests/test_run_tracker.py::test_a_run_killed_inside_the_trackers_call_sends_that_record_again_and_loses_none",
        ],
        "why": "the line before the tracker's call: a process killed inside the call loses the record for good",
        "from": "issue29_x_run",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "    if os.path.isdir(kept) and not os.path.islink(kept):\n",
        "replace": "    if False:\n",
        "tests": [
            "tests/test_run_tracker.py::test_a_list_of_sent_records_that_is_a_folder_is_refused_before_anything_resumes",
        ],
        "why": (
            "a folder where .metrics.jsonl.sent goes fails with a bare IsADirectoryError after the state was loaded"
        ),
        "from": "issue29_x_run",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "            rows /= self.proc.world_size\n",
        "replace": "",
        "tests": [
            "tests/test_resume_anywhere.py::test_a_chain_of_runs_on_2_1_3_2_processes_ends_as_the_uninterrupted_run",
        ],
        "why": "the window is summed over ranks, not averaged: the resumed record is W times too large",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": 'purge = step if resumed else 0 if any(self.tensorboard.glob("*tfevents*")) else None',
        "replace": 'purge = step + 1 if resumed else 0 if any(self.tensorboard.glob("*tfevents*")) else None',
        "tests": [
            "tests/test_tensorboard_resume.py::test_a_run_resumed_after_a_crash_past_its_checkpoint_has_each_step_once",
        ],
        "why": "20.11: TensorBoard's purge keeps the resumed step, which is written back: shown twice",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "    if h5 is not None and not h5.memory_mapped:",
        "replace": "    if False:",
        "tests": [
            "tests/test_hdf5.py::test_the_bottleneck_report_advises_what_fits_an_hdf5_file",
        ],
        "why": "a file h5py reads called 'a ct.cache store already: make its augment cheaper'",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "per_update = flops * world / updates if",
        "replace": "per_update = flops / updates if",
        "tests": [
            "tests/test_stragglers.py::test_the_slowed_rank_is_named_with_its_host_and_what_it_waited_on",
        ],
        "why": "flops_per_update of one rank, not of the global batch",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "record.update(self._throughput(samples_ * world, units * world, flops, updates, elapsed))",
        "replace": "record.update(self._throughput(samples_, units, flops, updates, elapsed))",
        "tests": [
            "tests/test_stragglers.py::test_the_slowed_rank_is_named_with_its_host_and_what_it_waited_on",
        ],
        "why": "samples_per_s the ranks' mean, not their sum",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": 'fields["mfu"] = mfu(per_update, rate, self.peak, world)',
        "replace": 'fields["mfu"] = mfu(per_update, rate, self.peak, 1)',
        "tests": [
            "tests/test_stragglers.py::test_the_slowed_rank_is_named_with_its_host_and_what_it_waited_on",
        ],
        "why": "MFU against one device's peak while every rank's FLOPs are counted",
        "from": "observability",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": '            "lr": rates[0] if rates else None,',
        "replace": '            "lr": rates[-1] if rates else None,',
        "tests": [
            "tests/test_run_lr.py::test_with_several_groups_the_first_groups_rate_is_logged",
        ],
        "why": "24.2: the last group's rate logged, not the first's as documented",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": '            **({"lr_groups": rates} if len(rates) > 1 else {}),',
        "replace": '            **({"lr_groups": rates[1:]} if len(rates) > 1 else {}),',
        "tests": [
            "tests/test_run_lr.py::test_with_several_groups_every_groups_rate_is_logged_in_the_file_tensorboard_and_the_plot",
        ],
        "why": "37.6: lr_groups without the first group's rate",
        "from": "timm_recipes",
    },
]
