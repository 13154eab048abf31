"""Planted bugs for the x-data adversary's fixes (issue 29): spawn-safe worker init, manifest formats that are not
versions, and the store's own items compared at open (see tools/mutants.py)."""

MUTANTS = [
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "    return functools.partial(_init_worker, seed, rank)",
        "replace": "    return lambda worker_id: _init_worker(seed, rank, worker_id)",
        "tests": ["tests/test_data.py"],
        "why": "the workers' init is a closure again: no worker starts under spawn",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": '    seed_everything(derive_seed(seed, "worker", rank=rank, worker=worker_id))',
        "replace": '    seed_everything(derive_seed(seed, "worker", rank=rank, worker=0))',
        "tests": ["tests/test_data.py"],
        "why": "every worker seeded alike",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": 'if type(raw["format"]) is not int or raw["format"] < 1:',
        "replace": "if False:",
        "tests": ["tests/test_cache_store.py"],
        "why": "a manifest with the four keys and format 'webdataset' or null is taken for a store and replaced",
    },
    {
        "file": "src/composetrain/data/store_files.py",
        "find": 'if type(raw["format"]) is not int or raw["format"] < 1:',
        "replace": 'if not isinstance(raw["format"], int) or raw["format"] < 1:',
        "tests": ["tests/test_cache_store.py"],
        "why": "format true (a bool is an int) is taken for version 1",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    if not all(same_item(s, items[i]) for i, s in zip(sampled, stored, strict=True)):",
        "replace": "    if False:",
        "tests": ["tests/test_cache_store.py", "tests/test_cache_store.py"],
        "why": "the store's own items are never compared at open: altered files served as the dataset's items",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    stored = _plain(data).__getitems__(sampled)  # mapped by a copy",
        "replace": "    stored = [items[i] for i in sampled]  # mapped by a copy",
        "tests": ["tests/test_cache_store.py", "tests/test_cache_store.py"],
        "why": "the dataset's items compared with themselves, not with the store's",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    stored = _plain(data).__getitems__(sampled)  # mapped by a copy",
        "replace": "    stored = data.__getitems__(sampled)  # mapped by a copy",
        "tests": ["tests/test_cache_store.py"],
        "why": "the check maps the store in the opened dataset itself: a rebuild after open is read, not refused",
    },
]
