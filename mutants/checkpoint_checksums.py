"""The planted bugs of src/composetrain/checkpoint/checksums.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/checksums.py",
        "find": "    except (ValueError, KeyError, TypeError, RecursionError) as e:",
        "replace": "    except (ValueError, KeyError, TypeError) as e:",
        "tests": [
            "tests/test_checkpoint_trust.py::test_a_checksum_list_nested_too_deep_for_json_is_a_corrupt_checkpoint",
        ],
        "why": (
            "a checksums.json of [[[[... raises RecursionError out of ct.run instead of being a corrupt checkpoint"
        ),
        "from": "issue29_x_run",
    },
]
