"""The planted bugs of src/composetrain/transforms/lr_rules.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/lr_rules.py",
        "find": "if steps > 2**53:",
        "replace": "if steps > 2**53 + 1:",
        "tests": [
            "tests/test_lr_limits.py::test_a_warmup_too_long_for_a_float_is_refused_when_built",
        ],
        "why": "warmup's step limit off by one",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/transforms/lr_rules.py",
        "find": "with contextlib.suppress(TypeError, ValueError, RuntimeError, OverflowError):",
        "replace": "with contextlib.suppress(TypeError, ValueError, RuntimeError):",
        "tests": [
            "tests/test_lr_limits.py::test_a_then_returning_an_int_too_large_for_a_float_is_refused_by_name",
        ],
        "why": "then() returning an int past 1e308 raises a bare OverflowError",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/transforms/lr_rules.py",
        "find": "if not (math.isfinite(number) and number >= 0):",
        "replace": "if not number >= 0:",
        "tests": [
            "tests/test_lr_limits.py::test_a_then_that_returns_no_multiplier_is_refused_at_its_call",
        ],
        "why": "then() returning inf is taken as a multiplier",
        "from": "issue19",
    },
]
