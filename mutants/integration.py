"""Planted bugs for the fixes made while merging issues 22-25 (see tools/mutants.py)."""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": "            if ddp.static_graph:  # before the pass's forward: nothing has changed yet",
        "replace": "            if False:  # before the pass's forward: nothing has changed yet",
        "tests": [
            "tests/test_distributed.py::"
            "test_static_graph_with_micro_batches_is_refused_before_any_change_and_works_without_them"
        ],
        "why": "static_graph=True with accumulate(n>1): torch's reducer asserts at the first no_sync backward",
    },
    {
        "file": "src/composetrain/transforms/_shard_units.py",
        "find": "        isinstance(modules, (tuple, list)) and modules and all(isinstance(m, type) for m in modules)",
        "replace": "        isinstance(modules, tuple) and modules and all(isinstance(m, type) for m in modules)",
        "tests": [
            "tests/test_module_predicates.py::"
            "test_sharded_takes_classes_as_a_list_or_a_tuple_as_checkpoint_activations_does"
        ],
        "why": "sharded(modules=[Block, nn.Linear]) refused as 'must be submodule names'",
    },
    {
        "file": "src/composetrain/__init__.py",
        "find": (
            '            if public == name or not module.startswith("composetrain.data."):\n                raise\n'
        ),
        "replace": "            raise\n",
        "tests": [
            "tests/test_lazy_package.py::test_without_numpy_ct_run_trains_and_only_the_data_layers_names_need_it"
        ],
        "why": "without NumPy every public name fails, ct.run included",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "from composetrain.data.kinds import as_hdf5, as_mapped, augmented_inside\n",
        "replace": (
            "from composetrain.data.hdf5 import HDF5Dataset as _H\n"
            "from composetrain.data.kinds import as_hdf5, as_mapped, augmented_inside\n"
        ),
        "tests": [
            "tests/test_lazy_package.py::test_without_numpy_ct_run_trains_and_only_the_data_layers_names_need_it"
        ],
        "why": "the driver imports the data layer (and NumPy) for a run over other data",
    },
]
