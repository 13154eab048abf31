"""The planted bugs of src/composetrain/core/rng.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/rng.py",
        "find": 'numpy = sys.modules.get("numpy") if "numpy" in kinds else None',
        "replace": "numpy = None",
        "tests": [
            "tests/test_rng_streams.py::test_a_snapshot_puts_back_every_generator",
        ],
        "why": "the snapshot forgets NumPy: a failed attempt's or a recomputation's NumPy draws are not given back",
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": 'self.rng = torch.get_rng_state() if "torch" in kinds else None',
        "replace": 'self.rng = torch.get_rng_state() if "torch" in EVERY else None',
        "tests": [
            "tests/test_rng_streams.py::test_a_snapshot_of_some_generators_leaves_the_others_running",
        ],
        "why": (
            "a snapshot of Python's and NumPy's generators puts torch's back too (activation checkpointing's "
            "replay would undo the draws torch made meanwhile)"
        ),
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "        self.py_rng = random.getstate() if",
        "replace": "        self.py_rng = random.Random().getstate() if",
        "tests": [
            "tests/test_rng_streams.py::test_a_snapshot_puts_back_every_generator",
        ],
        "why": "the snapshot takes a fresh generator's state, not the global one's",
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "        return seed * 1000003 + rank\n",
        "replace": "        return seed + rank\n",
        "tests": [
            "tests/test_rng_streams.py::test_derived_seeds_are_those_runs_were_resumed_with",
        ],
        "why": (
            "a fresh start's seed changed: rank 1 of seed 0 draws as rank 0 of seed 1, and a checkpoint's "
            "streams differ"
        ),
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "        return seed * 7919 + rank\n",
        "replace": "        return seed * 7919 + rank * 104729\n",
        "tests": [
            "tests/test_rng_streams.py::test_derived_seeds_are_those_runs_were_resumed_with",
        ],
        "why": (
            "the loader's generator seeded as the workers are: a resumed run's loader seeds its workers differently"
        ),
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "        return (seed * 7919 + rank * 104729 + 1009 * worker) % 2**32\n",
        "replace": "        return seed * 7919 + rank * 104729 + 1009 * worker\n",
        "tests": [
            "tests/test_rng_streams.py::test_derived_seeds_for_a_few_runs",
        ],
        "why": (
            "a worker's seed not wrapped below 2**32: a large seed's workers draw otherwise than in the runs before"
        ),
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": 'HOST = ("python", "numpy")',
        "replace": 'HOST = ("python",)',
        "tests": [
            "tests/test_recomputed_randomness.py::test_python_and_numpy_draws_are_replayed",
        ],
        "why": "only Python's stream replayed, NumPy's not",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "            random.setstate(self.py_rng)\n",
        "replace": "            pass\n",
        "tests": [
            "tests/test_auto_accumulate_undo.py::test_python_numpy_torch_streams_and_every_buffer_are_those_of_accumulate_n",
        ],
        "why": "a failed attempt's Python draws are not given back",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "            numpy.random.set_state(saved)\n",
        "replace": "            del saved\n",
        "tests": [
            "tests/test_auto_accumulate_undo.py::test_python_numpy_torch_streams_and_every_buffer_are_those_of_accumulate_n",
        ],
        "why": "a failed attempt's NumPy draws are not given back",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "            numpy.random.set_state(saved)\n",
        "replace": "            pass\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: NumPy's generator advanced by a refused call's step",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "            random.setstate(self.py_rng)\n",
        "replace": "            pass\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: Python's generator advanced by a refused call's step",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "            torch.set_rng_state(self.rng)\n",
        "replace": "            pass\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: torch's generator advanced by a refused call's dropout",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "        return seed + epoch\n",
        "replace": "        return seed + epoch + 1\n",
        "tests": [
            "tests/test_global_batch.py::test_the_order_is_distributed_samplers_and_the_shares_split_as_documented",
        ],
        "why": (
            "the global order drifts from DistributedSampler's: on one process global_batch_size is no longer "
            "batch_size"
        ),
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": '"gauss": gauss}',
        "replace": '"gauss": None}',
        "tests": [
            "tests/test_rng_streams.py::test_the_cached_gaussian_is_in_the_saved_state",
        ],
        "why": "20.9: Python's cached Gaussian is dropped from the checkpoint",
        "from": "issue20",
    },
]
