"""Planted bugs for the y-data adversary's fixes (issue 29): a store is replaced only when it holds nothing but
its own files, and only its own files are ever removed (see tools/mutants.py)."""

MUTANTS = [
    {
        "file": "src/composetrain/data/store.py",
        "find": "    others = foreign(path) if replacing else []",
        "replace": "    others = []",
        "tests": ["tests/test_cache_store.py"],
        "why": "rebuild=True replaces a store folder holding the user's files (or a copied manifest): they are deleted",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "        if name not in others:",
        "replace": "        if True:",
        "tests": ["tests/test_cache_store.py"],
        "why": "removing an old store deletes whatever is in it (a file put there as it was replaced)",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": '_OWN = re.compile(r"f[0-9]+[os]?\\.npy")',
        "replace": '_OWN = re.compile(r"f[0-9]+[os]?\\.np.")',
        "tests": ["tests/test_cache_store.py"],
        "why": "a user's file whose name resembles a store's array is taken for the store's own and removed",
    },
    {
        "file": "src/composetrain/data/store.py",
        "find": "        if not (plain and (name == MANIFEST or _OWN.fullmatch(name))):",
        "replace": "        if not (name == MANIFEST or _OWN.fullmatch(name)):",
        "tests": ["tests/test_cache_store.py"],
        "why": "a link named like a store's array is taken for the store's own",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": "            kept[i] = copy.deepcopy(item)",
        "replace": "            kept[i] = item",
        "tests": ["tests/test_cache_store.py"],
        "why": "the fingerprint is made of the items as the last read left them: a correct store refused as altered",
    },
    {
        "file": "src/composetrain/data/cache.py",
        "find": "    items = {i: copy.deepcopy(dataset[i]) for i in sampled}",
        "replace": "    items = {i: dataset[i] for i in sampled}",
        "tests": ["tests/test_cache_store.py"],
        "why": "an open compares the store with the dataset's items as the last read left them",
    },
    {
        "file": "src/composetrain/data/writer.py",
        "find": '    n = origin["length"]',
        "replace": "    n = len(dataset)",
        "tests": ["tests/test_cache.py"],
        "why": "a dataset whose len changes while written: a store of another length is published, then refused",
    },
]
