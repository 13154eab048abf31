"""The planted bugs of src/composetrain/transforms/_recompute.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_recompute.py",
        "find": "        self.start = Generators(HOST)\n",
        "replace": '        self.start = Generators(("python",))\n',
        "tests": [
            "tests/test_recomputed_randomness.py::test_the_recomputation_draws_the_forwards_numbers_where_backward_needs_them",
        ],
        "why": (
            "the replay's snapshot forgets NumPy (its stream still put back after): the recomputation draws "
            "other numbers than the forward, and backward computes with them"
        ),
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/transforms/_recompute.py",
        "find": "        self.start.restore()\n",
        "replace": "",
        "tests": [
            "tests/test_recomputed_randomness.py::test_python_and_numpy_draws_are_replayed",
        ],
        "why": "the recomputation draws Python's and NumPy's numbers afresh, not the forward's",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/transforms/_recompute.py",
        "find": "        stack.callback(Generators(HOST).restore)\n",
        "replace": "",
        "tests": [
            "tests/test_recomputed_randomness.py::test_draws_after_the_forward_are_not_replayed_into_the_recomputation",
        ],
        "why": "the recomputation leaves the streams where the forward left them: later draws repeat",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/transforms/_recompute.py",
        "find": 'if any(k.__name__ == "Cache" and k.__module__.startswith("transformers") for k in kinds):',
        "replace": 'if any(k.__name__ == "Cache" and k.__module__ == "transformers" for k in kinds):',
        "tests": [
            "tests/test_hf.py::test_a_key_value_cache_under_checkpointed_blocks_is_refused_before_backward",
        ],
        "why": "25.11: the Cache class looked for in transformers' top module, where it is only re-exported",
        "from": "issue25_hf",
    },
    {
        "file": "src/composetrain/transforms/_recompute.py",
        "find": 'flagged = [m for m in module.modules() if getattr(m, "gradient_checkpointing", False) is True]',
        "replace": 'flagged = [m for m in module.children() if getattr(m, "gradient_checkpointing", False) is True]',
        "tests": [
            "tests/test_hf.py::test_transformers_own_checkpointing_under_checkpoint_activations_is_refused",
        ],
        "why": "25.12: the chosen block itself not looked at, only its children (GPT2Block's flag is its own)",
        "from": "issue25_hf",
    },
]
