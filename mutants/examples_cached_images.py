"""The planted bugs of examples/cached_images.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "examples/cached_images.py",
        "find": 'key={"size": args.size}, ',
        "replace": "",
        "tests": [
            "tests/test_cached_images_example.py::test_a_store_of_another_size_is_a_usage_error_not_a_shape_error",
        ],
        "why": "a --cache store of another --size mapped: a shape error from the model",
        "from": "issue22_hdf5",
    },
    {
        "file": "examples/cached_images.py",
        "find": "        warm_up(args)\n",
        "replace": "",
        "tests": [
            "tests/test_cached_images_example.py::test_the_epoch_speedup_counts_the_fixed_costs_of_a_run_alike",
        ],
        "why": "the first run's one-off costs counted against the decoded epoch",
        "from": "issue22_hdf5",
    },
    {
        "file": "examples/cached_images.py",
        "find": 'epoch = {"decoded": plain_s, "cached": once_s}',
        "replace": 'epoch = {"decoded": plain_s, "cached": once_s / args.epochs}',
        "tests": [
            "tests/test_cached_images_example.py::test_the_epoch_speedup_counts_the_fixed_costs_of_a_run_alike",
        ],
        "why": "a run's fixed cost divided by --epochs on the cached side only",
        "from": "issue22_hdf5",
    },
    {
        "file": "examples/cached_images.py",
        "find": "        if folder is not None and folder.exists() and not folder.is_dir():",
        "replace": "        if False:",
        "tests": [
            "tests/test_cached_images_example.py::test_a_file_where_a_folder_belongs_is_a_usage_error_before_any_work",
        ],
        "why": "a file given for --images or --cache: a traceback after an epoch of decoding",
        "from": "issue22_hdf5",
    },
]
