"""The planted bugs of src/composetrain/__init__.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/__init__.py",
        "find": (
            '            if public == name or not module.startswith("composetrain.data."):\n                raise\n'
        ),
        "replace": "            raise\n",
        "tests": [
            "tests/test_lazy_package.py::test_without_numpy_ct_run_trains_and_only_the_data_layers_names_need_it",
        ],
        "why": "without NumPy every public name fails, ct.run included",
        "from": "integration",
    },
    {
        "file": "src/composetrain/__init__.py",
        "find": ('    "write_tokens",\n]'),
        "replace": ('    "write_tokens",\n    "__version__",\n]'),
        "tests": [
            "tests/test_docs.py::test_every_public_name_has_its_entry_in_the_api_reference",
            "tests/test_docs.py::test_the_api_table_lists_every_public_name_once",
        ],
        "why": "a public name added without its entry in the API reference (nor its line in the API table)",
        "from": "issue38_docs",
    },
]
