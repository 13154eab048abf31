"""The planted bugs of benchmarks/bench_cache.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "benchmarks/bench_cache.py",
        "find": '    parser.add_argument("--rounds", type=at_least(1), default=7)',
        "replace": '    parser.add_argument("--rounds", type=int, default=7)',
        "tests": [
            "tests/test_cached_images_example.py::test_the_cache_benchmark_refuses_sizes_it_cannot_measure",
        ],
        "why": "--rounds 0 measured nothing: an IndexError from the report",
        "from": "issue22_hdf5",
    },
    {
        "file": "benchmarks/bench_cache.py",
        "find": "    if int(args.mb * 1e6 / 4 / args.features) < 1:",
        "replace": "    if False:",
        "tests": [
            "tests/test_cached_images_example.py::test_the_cache_benchmark_refuses_sizes_it_cannot_measure",
        ],
        "why": "--mb too small for one row: NumPy's 'high <= 0' from the index draw",
        "from": "issue22_hdf5",
    },
]
