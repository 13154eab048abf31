"""Planted bugs for issue 31 item 1 (one argument and message convention, data/ included): ct.cache's and ct.hdf5's
arguments through core/util's checks, ct.rendezvous's timeout, ema's decay message, and the fix a damaged store's
message gives now that ct.cache no longer appends it; each caught by the tests named for it (see tools/mutants.py)."""

CACHE = "src/composetrain/data/cache.py"
RULE = "tests/test_conventions.py::test_numeric_and_flag_arguments_follow_one_rule"  # values drawn
EDGES = "tests/test_conventions.py::test_the_edges_of_each_arguments_rule"  # the edges, every time
BAD_ARGS = "tests/test_cache.py::test_bad_arguments_are_refused_before_anything_is_written"
STORE = "tests/test_cache_store.py"

MUTANTS = [
    {
        "file": CACHE,
        "find": '    check_bool(rebuild, CACHE, "rebuild")\n',
        "replace": "",
        "tests": [f"{EDGES}[cache-rebuild]", f"{RULE}[cache-rebuild]", BAD_ARGS],
        "why": "rebuild=1 (or 'no') taken for True: the store written again on a typo",
    },
    {
        "file": CACHE,
        "find": '    check_bool(progress, CACHE, "progress")\n',
        "replace": "",
        "tests": [
            f"{EDGES}[cache-progress]",
            f"{RULE}[cache-progress]",
            f"{STORE}::test_verify_and_progress_must_be_bools",
        ],
        "why": "progress='no' draws a progress bar",
    },
    {
        "file": CACHE,
        "find": 'CACHE, "seed", minimum=-(2**63), maximum=2**63 - 1',
        "replace": 'CACHE, "seed", minimum=-(2**99), maximum=2**99',
        "tests": [f"{EDGES}[cache-seed]", f"{RULE}[cache-seed]"],
        "why": "a seed past int64 accepted: an OverflowError at the first augmented read, far from the call",
    },
    {
        "file": CACHE,
        "find": '    seed = check_int(seed, CACHE, "seed",',
        "replace": '    seed = seed if isinstance(seed, float) else check_int(seed, CACHE, "seed",',
        "tests": [f"{EDGES}[cache-seed]", f"{RULE}[cache-seed]", BAD_ARGS],
        "why": "seed=1.5 accepted, and truncated when it seeds the augmentation",
    },
    {
        "file": CACHE,
        "find": '    if not (isinstance(workers, str) and workers == "auto"):',
        "replace": "    if not isinstance(workers, str):",
        "tests": [f"{EDGES}[cache-num_workers]", f"{RULE}[cache-num_workers]"],
        "why": "num_workers='al' (any string) accepted: a ValueError from int() once writing begins, or never",
    },
    {
        "file": CACHE,
        "find": 'CACHE, "num_workers", minimum=0',
        "replace": 'CACHE, "num_workers", minimum=1',
        "tests": [
            f"{EDGES}[cache-num_workers]",
            f"{RULE}[cache-num_workers]",
            "tests/test_cache.py::test_conjugate_and_negative_views_are_stored_as_their_values",
        ],
        "why": "num_workers=0 (read in this process) refused",
    },
    {
        "file": CACHE,
        "find": 'CACHE, "timeout", finite=False',
        "replace": 'CACHE, "timeout", finite=True',
        "tests": [f"{EDGES}[cache-timeout]", f"{RULE}[cache-timeout]"],
        "why": "timeout=float('inf') (wait for the writer however long it takes) refused",
    },
    {
        "file": CACHE,
        "find": 'CACHE, "timeout", finite=False',
        "replace": 'CACHE, "timeout", positive=False, finite=False',
        "tests": [f"{EDGES}[cache-timeout]", f"{RULE}[cache-timeout]", BAD_ARGS],
        "why": "timeout=0 accepted: a waiting process gives up at once",
    },
    {
        "file": CACHE,
        "find": '        raise TypeError(\n            f"{CACHE}: augment must be a function',
        "replace": '        raise ValueError(\n            f"{CACHE}: augment must be a function',
        "tests": [BAD_ARGS],
        "why": "a non-function augment a ValueError in ct.cache, a TypeError in ct.hdf5 and ct.run",
    },
    {
        "file": CACHE,
        "find": '        raise TypeError(\n            f"{CACHE}: dataset is an IterableDataset',
        "replace": '        raise ValueError(\n            f"{CACHE}: dataset is an IterableDataset',
        "tests": ["tests/test_cache.py::test_an_iterable_dataset_is_refused_even_with_a_len"],
        "why": "an IterableDataset a ValueError in ct.cache and a TypeError in ct.run",
    },
    {
        "file": CACHE,
        "find": "    if not isinstance(path, str | os.PathLike):\n        raise TypeError(",
        "replace": "    if not isinstance(path, str | os.PathLike):\n        raise ValueError(",
        "tests": [BAD_ARGS],
        "why": "a path of the wrong kind (3) a ValueError, unlike ct.hdf5's file",
    },
    {
        "file": "src/composetrain/data/hdf5.py",
        "find": '    seed = check_int(seed, HDF5, "seed", minimum=-(2**63), maximum=2**63 - 1, example="seed=0")',
        "replace": "    seed = int(seed)",
        "tests": [f"{EDGES}[ct.hdf5-seed]", f"{RULE}[ct.hdf5-seed]"],
        "why": "ct.hdf5's seed taken by int(): 1.5 and True accepted, a string a ValueError, a seed past int64 kept",
    },
    {
        "file": "src/composetrain/core/util.py",
        "find": "    if index < minimum or (maximum is not None and index > maximum):",
        "replace": "    if index < minimum:",
        "tests": [
            f"{EDGES}[cache-seed]",
            f"{RULE}[cache-seed]",
            f"{EDGES}[ct.hdf5-seed]",
            f"{RULE}[ct.hdf5-seed]",
            "tests/test_hdf5.py::test_a_seed_beyond_64_bits_is_refused_when_made",
        ],
        "why": "check_int's maximum ignored: a seed past int64 accepted by ct.cache and ct.hdf5",
    },
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": '    timeout = check_real(timeout, "rendezvous", "timeout", example=',
        "replace": '    timeout = check_real(timeout, "rendezvous", "timeout", finite=False, example=',
        "tests": [f"{EDGES}[rendezvous-timeout]", f"{RULE}[rendezvous-timeout]"],
        "why": "timeout=inf accepted: an OverflowError from timedelta when a multi-process group is set up",
    },
    {
        "file": "src/composetrain/launch/rendezvous.py",
        "find": '    timeout = check_real(timeout, "rendezvous", "timeout", example="timeout=300 (seconds)")',
        "replace": "    timeout = float(timeout)",
        "tests": [
            f"{EDGES}[rendezvous-timeout]",
            f"{RULE}[rendezvous-timeout]",
            "tests/test_rendezvous.py::test_bad_arguments",
        ],
        "why": "the timeout taken by float(): True is one second, 0 and NaN accepted, '300' a string turned number",
    },
    {
        "file": "src/composetrain/transforms/ema.py",
        "find": "got {show(given)}; e.g. ema(0.999)",
        "replace": "got {decay}; e.g. ema(0.999)",
        "tests": [f"{EDGES}[ema-decay]", f"{RULE}[ema-decay]"],
        "why": "an out-of-range decay shown without its type (np.float64(1.5) reads 1.5)",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": '(truncated or altered): {REWRITE}"',
        "replace": '(truncated or altered)"',
        "tests": [f"{STORE}::test_a_damaged_store_is_still_a_store_and_is_rebuilt_on_request"],
        "why": "a truncated array's message without the fix (ct.cache no longer appends one)",
    },
    {
        "file": CACHE,
        "find": "its fingerprint of the items is missing or malformed; {REWRITE}",
        "replace": "its fingerprint of the items is missing or malformed",
        "tests": [f"{STORE}::test_a_crafted_fingerprint_is_refused_rather_than_read_whole_or_skipped"],
        "why": "a crafted fingerprint's message without the fix (ct.cache no longer appends one)",
    },
]
