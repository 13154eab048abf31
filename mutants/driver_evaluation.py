"""The planted bugs of src/composetrain/driver/evaluation.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/evaluation.py",
        "find": "metric_names(metrics, EVAL_FIELDS, ",
        "replace": "metric_names(metrics, EVAL_FIELDS | {'loss', 'lr'}, ",
        "tests": [
            "tests/test_metric_names.py::test_an_eval_metric_named_loss_or_lr_is_kept_in_the_file",
        ],
        "why": "evaluations refuse the training record's fields (loss, lr), which they never write",
        "from": "issue19",
    },
]
