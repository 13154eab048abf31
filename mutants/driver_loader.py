"""The planted bugs of src/composetrain/driver/loader.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "    return functools.partial(_init_worker, seed, rank)",
        "replace": "    return lambda worker_id: _init_worker(seed, rank, worker_id)",
        "tests": [
            "tests/test_data.py",
        ],
        "why": "the workers' init is a closure again: no worker starts under spawn",
        "from": "issue29_x_data",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": '    seed_everything(derive_seed(seed, "worker", rank=rank, worker=worker_id))',
        "replace": '    seed_everything(derive_seed(seed, "worker", rank=rank, worker=0))',
        "tests": [
            "tests/test_data.py",
        ],
        "why": "every worker seeded alike",
        "from": "issue29_x_data",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "        batch_size = sampler.per_rank",
        "replace": "        batch_size = options.global_batch_size",
        "tests": [
            "tests/test_resume_anywhere.py::test_the_same_job_on_1_2_and_3_processes_trains_the_same_model_and_logs_the_same_records",
            "tests/test_resume_anywhere.py::test_a_chain_of_runs_on_2_1_3_2_processes_ends_as_the_uninterrupted_run",
        ],
        "why": "the reader's batch size is G, not G/W: records say W*G, a resume skips W times the updates done",
        "from": "global_batch",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "    whole = mapped(data, collate_fn)",
        "replace": "    whole = False",
        "tests": [
            "tests/test_cache_run.py::test_augmentation_in_loader_workers_draws_as_in_this_process",
        ],
        "why": "loader workers read a cache through __getitems__: their copy never sees the epoch",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": (
            "    if (mapped_data := as_mapped(loader.dataset)) is not None:\n        mapped_data.set_epoch(epoch)"
        ),
        "replace": "    pass",
        "tests": [
            "tests/test_cache_odd.py::test_a_given_dataloader_run_by_ct_run_augments_each_epoch_anew",
        ],
        "why": "ct.run over a given DataLoader of an augmented cache draws the same augmentation every epoch",
        "from": "issue22_cache",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "        mapped_data.set_epoch(epoch)",
        "replace": "        pass",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_dataloader_given_to_ct_run_augments_per_epoch",
        ],
        "why": "a DataLoader given to ct.run over an augmented dataset: the same draw every epoch",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "        if augmented and data.num_workers > 0 and data.persistent_workers:",
        "replace": "        if False:",
        "tests": [
            "tests/test_hdf5_hostile.py::test_a_dataloader_whose_persistent_workers_never_see_the_epoch_is_refused",
        ],
        "why": "persistent workers over an augmented dataset accepted: they never see the epoch",
        "from": "issue22_hdf5",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": ("which pass no epoch on\n        store.set_epoch(epoch)"),
        "replace": ("which pass no epoch on\n        store.set_epoch(0)"),
        "tests": [
            "tests/test_cache_wrapped.py::test_a_given_dataloader_over_a_subset_of_an_augmented_store_draws_anew_each_epoch",
        ],
        "why": "a given DataLoader's epoch never reaches a store inside its Subset",
        "from": "issue29_reader",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "        augmented = augmented or bool(augmented_inside(data.dataset))",
        "replace": "        augmented = augmented",
        "tests": [
            "tests/test_cache_wrapped.py::test_a_given_dataloader_over_a_subset_of_an_augmented_store_draws_anew_each_epoch",
        ],
        "why": "persistent workers over a Subset of an augmented store accepted: they keep their first epoch",
        "from": "issue29_reader",
    },
]
