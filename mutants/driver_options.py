"""The planted bugs of src/composetrain/driver/options.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/options.py",
        "find": "            if log_file is not None and _within(folder, log_file)\n",
        "replace": "            if log_file is not None and _within(log_file, folder)\n",
        "tests": [
            "tests/test_profile_window.py::test_the_run_folder_itself_may_hold_the_traces_beside_the_metrics_file",
        ],
        "why": "the containment tested the wrong way round: a trace folder holding the metrics file is refused",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "            if folder.exists() and not folder.is_dir()\n",
        "replace": "            if False\n",
        "tests": [
            "tests/test_profile_window.py::test_a_trace_folder_that_cannot_be_made_is_refused_before_the_first_update",
        ],
        "why": "a file where the trace folder goes is found only at the window's end, updates into the run",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "        if self.oom_snapshot and self.folder is None:",
        "replace": "        if self.oom_snapshot and self.folder is None and False:",
        "tests": [
            "tests/test_profile_window.py::test_oom_snapshot_without_a_run_folder_is_refused",
        ],
        "why": "oom_snapshot without a run folder accepted: the snapshot silently never written",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "        run_folder = Path(local_path(directory)).expanduser() if local else None\n",
        "replace": "        run_folder = Path(directory).expanduser() if directory is not None else None\n",
        "tests": [
            "tests/test_profile_window.py::test_a_file_url_checkpoint_dir_gets_its_traces_in_the_folder_it_names",
            "tests/test_profile_window.py::test_a_remote_checkpoint_dir_is_no_folder_for_traces",
        ],
        "why": "a URL taken as a path: traces written to ./file:/... or ./s3:/... in the working directory",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "        if torch_profiler._is_profiler_enabled:  # torch runs one at a time",
        "replace": "        if False:  # torch runs one at a time",
        "tests": [
            "tests/test_profile_window.py::test_a_window_inside_a_profiler_of_the_users_is_refused_before_the_first_update",
        ],
        "why": "the window started inside the user's profiler: torch cancels the user's trace",
        "from": "adv36",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "            and data.persistent_workers\n",
        "replace": "",
        "tests": [
            "tests/test_streams.py::test_persistent_workers_that_would_never_see_set_epoch_are_refused_for_several_passes",
        ],
        "why": "every loader with workers refused for several passes, also those that start their workers each pass",
        "from": "adv33",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": 'DEFAULT_INTERVAL = "10min"',
        "replace": 'DEFAULT_INTERVAL = "epoch"',
        "tests": [
            "tests/test_checkpoint_interval.py::test_the_default_saves_every_ten_minutes",
        ],
        "why": "no default interval: a kill loses up to an epoch",
        "from": "checkpoint_async",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "        if isinstance(self.eval_step, TrainStep):",
        "replace": "        if isinstance(self.eval_step, TrainStep) and self.eval_data is None:",
        "tests": [
            "tests/test_compile_run.py::test_a_train_step_given_as_eval_step_is_refused_before_training",
        ],
        "why": "23.28: a TrainStep as eval_step trains a whole epoch, then fails in the evaluation, unclearly",
        "from": "issue23_compile",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "(not callable(self.on_record) or isinstance(self.on_record, type))",
        "replace": "not callable(self.on_record)",
        "tests": [
            "tests/test_run_tracker.py::test_a_tracker_that_is_no_function_is_refused_before_anything_runs",
        ],
        "why": "24.5: a class (dict, a tracker class not instantiated) accepted as on_record",
        "from": "issue24_recipes",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "if seed >= 2**32:",
        "replace": "if seed > 2**32:",
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "seed bound >= to >",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "if self.collate_fn is not None and isinstance(self.data, DataLoader):",
        "replace": "if False:",
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "collate_fn with DataLoader dropped",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "            not is_stream(data) if shuffle is None else shuffle,\n",
        "replace": "            bool(shuffle),\n",
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "shuffle default False",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": 'return check_int(value, RUN, "num_workers", minimum=0,',
        "replace": 'return check_int(value, RUN, "num_workers", minimum=1,',
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "num_workers minimum 1",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "if getattr(self, name) is not None and self.checkpoint_dir is None:",
        "replace": "if False:",
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "checkpoint_every without dir accepted",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": '/ "metrics.jsonl"',
        "replace": '/ "metrics.json"',
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "default log file name",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "if (self.eval_step is None) != (self.eval_data is None):",
        "replace": "if self.eval_step is not None and self.eval_data is None:",
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "eval pair one way only",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "_set(self, seed=seed)",
        "replace": "pass",
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "seed not normalised",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "1 if self.max_steps is None else None",
        "replace": "None if self.max_steps is None else 1",
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "total_epochs swapped",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "if tensorboard is True and log_path is None:",
        "replace": "if False:",
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "tensorboard=True without log accepted",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "        check_eval_data(eval_data, data)\n",
        "replace": "",
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "eval_data vs data check dropped",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": 'check_int(value, RUN, name, example=f"{name}=10 or None")',
        "replace": 'check_int(value, RUN, name, minimum=0, example=f"{name}=10 or None")',
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "optional ints accept 0",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": 'check_real(self.timeout, RUN, "timeout",',
        "replace": 'check_real(self.timeout, RUN, "timeout", finite=False,',
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "timeout infinite accepted",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "            dataloader_settings(data, size, shuffle, drop_last)\n",
        "replace": "            pass\n",
        "tests": [
            "tests/test_run_options.py",
        ],
        "why": "DataLoader settings not compared",
        "from": "options",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "        if isinstance(self.data, DataLoader) and self.global_batch_size is not None:",
        "replace": (
            "        if isinstance(self.data, DataLoader) and self.batch_size is not None and "
            "self.global_batch_size is not None:"
        ),
        "tests": [
            "tests/test_global_batch.py::test_arguments_that_do_not_define_the_global_batch_are_refused_before_anything",
        ],
        "why": "a DataLoader with global_batch_size alone is used as given: G silently ignored",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "        if self.shuffle:\n",
        "replace": "        if False:\n",
        "tests": [
            "tests/test_streams.py::test_what_a_stream_cannot_take_is_refused_with_the_fix",
        ],
        "why": "shuffle=True with a stream is ignored, not refused",
        "from": "streams",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "    return seconds if seconds is None or math.isfinite(seconds) else None",
        "replace": "    return seconds",
        "tests": [
            "tests/test_checkpoint_interval.py::test_anything_else_is_refused_naming_the_forms_it_takes",
        ],
        "why": "a duration past 1e308 seconds accepted: inf, a clock that never saves",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": ' and texts[0] != "epoch" and counts[0] is not None:',
        "replace": ' and texts[0] != "epoch":',
        "tests": [
            "tests/test_checkpoint_interval.py::test_anything_else_is_refused_naming_the_forms_it_takes",
        ],
        "why": "(None, '30s') accepted while (5, None) is refused",
        "from": "adv35",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "ASYNC_DEFAULT = True",
        "replace": "ASYNC_DEFAULT = False",
        "tests": [
            "tests/test_checkpoint_interval.py::test_a_run_with_a_folder_saves_every_ten_minutes_unless_told_in_the_background_unless_told",
        ],
        "why": "saves block the training by default",
        "from": "adv35",
    },
]
