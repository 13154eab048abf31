"""The planted bugs of src/composetrain/plot.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/plot.py",
        "find": '"loss", "global_batch"}',
        "replace": '"loss"}',
        "tests": [
            "tests/test_plot_inputs.py::test_the_log_of_a_real_run_draws_its_metrics_and_no_bookkeeping",
        ],
        "why": "20.13: the plot draws ct.run's global_batch bookkeeping as a metric",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/plot.py",
        "find": "except (UnicodeDecodeError, ValueError, RecursionError) as e:",
        "replace": "except (UnicodeDecodeError, ValueError) as e:",
        "tests": [
            "tests/test_plot_inputs.py::test_a_line_the_reader_cannot_take_is_skipped_and_counted",
        ],
        "why": "a line nested too deep crashes the reader",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/plot.py",
        "find": "if not (_is_int(step) and _is_number(step)):",
        "replace": "if not _is_int(step):",
        "tests": [
            "tests/test_plot_inputs.py::test_a_line_the_reader_cannot_take_is_skipped_and_counted",
        ],
        "why": "a step no float holds is kept, and crashes the drawing",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/plot.py",
        "find": 'f"{m!r} (metric)" if m in titles else m',
        "replace": "m",
        "tests": [
            "tests/test_plot_inputs.py::test_a_metric_named_like_a_fixed_panel_keeps_its_own_panel",
        ],
        "why": "a metric named 'training loss' takes the loss panel",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/plot.py",
        "find": 'target = target.with_name(target.name + ".png")',
        "replace": "pass",
        "tests": [
            "tests/test_plot_inputs.py::test_the_path_printed_is_the_file_written",
        ],
        "why": "an output without a suffix: the path returned names no file",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/plot.py",
        "find": '                if not _is_number(v) and not (key == "lr" and v is None)',
        "replace": "                if not _is_number(v)",
        "tests": [
            "tests/test_run_lr.py::test_the_plot_takes_a_null_rate_as_no_point_without_a_warning",
        ],
        "why": "a-recipes: ct.run's own lr null warned about as bad data, once per record",
        "from": "issue24_recipes",
    },
]
