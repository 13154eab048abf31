"""The planted bugs of src/composetrain/core/metric_names.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/metric_names.py",
        "find": "name = k if type(k) is str else str.__str__(k)",
        "replace": "name = k",
        "tests": [
            "tests/test_metric_names.py::test_str_subclass_names_are_logged_saved_and_resumed_as_plain_str",
        ],
        "why": "a str subclass (StrEnum, np.str_) kept as the metric's name: the checkpoint cannot hold it",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/core/metric_names.py",
        "find": '"data_wait", "global_batch", "eval"}',
        "replace": '"data_wait", "eval"}',
        "tests": [
            "tests/test_metric_names.py::test_the_reserved_names_are_every_field_the_driver_writes",
        ],
        "why": "global_batch missing from the reserved names: a metric of that name overwrites the field",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/core/metric_names.py",
        "find": "if name in plain:",
        "replace": "if name in plain and plain[name] is v:",
        "tests": [
            "tests/test_metric_values_refused.py::test_two_training_metrics_that_name_the_same_text_are_refused_not_merged",
        ],
        "why": "two metrics of the same text merged, one silently overwriting the other",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/core/metric_names.py",
        "find": "            name.encode()\n",
        "replace": '            name.encode(errors="surrogateescape")\n',
        "tests": [
            "tests/test_metric_values_refused.py::test_a_metric_name_that_utf8_cannot_encode_is_refused_at_the_first_update",
        ],
        "why": "a name with a lone surrogate passes the check and crashes TensorBoard's writer later",
        "from": "issue19",
    },
]
