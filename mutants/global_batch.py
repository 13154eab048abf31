# ruff: noqa: E501
"""Planted bugs for issue 32 (resume anywhere: ct.run(global_batch_size=G), the same run on any number of processes).

The entries naming tests/test_resume_anywhere.py replay its whole fixture (a pool of 2 ranks, one of 3, about a
minute); the others run in this process in seconds.
"""

UNIT = "tests/test_global_batch.py"
ANY = "tests/test_resume_anywhere.py"
SAME = f"{ANY}::test_the_same_job_on_1_2_and_3_processes_trains_the_same_model_and_logs_the_same_records"
CHAIN = f"{ANY}::test_a_chain_of_runs_on_2_1_3_2_processes_ends_as_the_uninterrupted_run"
REFUSED = f"{ANY}::test_what_cannot_be_exact_is_refused_before_anything_changes"
SEQUENCE = f"{UNIT}::test_each_update_is_the_same_samples_on_any_number_of_processes"

MUTANTS = [
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": "    return start, start + base + (rank < extra)",
        "replace": "    return start, start + base + (rank <= extra)",
        "tests": [SEQUENCE],
        "why": "a rank's share one sample too long: neighbouring ranks read a sample twice",
    },
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": "        return order[k * self.global_batch_size : (k + 1) * self.global_batch_size]",
        "replace": "        return order[k * self.global_batch_size + 1 : (k + 1) * self.global_batch_size + 1]",
        "tests": [SEQUENCE],
        "why": "the update's slice off by one: the epoch's first sample never trained, one shared by two updates",
    },
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": '        g.manual_seed(derive_seed(self.seed, "order", epoch=epoch))',
        "replace": '        g.manual_seed(derive_seed(self.seed, "order", epoch=epoch) + self.world_size)',
        "tests": [SEQUENCE, SAME],
        "why": "the epoch's order drawn with the world size in its seed: another W trains on other updates",
    },
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": "        return full + (short > 0 and not self.drop_last)",
        "replace": "        return full + (short > 0)",
        "tests": [SEQUENCE],
        "why": "drop_last ignored in the count: an empty last update, or the short one kept",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": "        return seed + epoch\n",
        "replace": "        return seed + epoch + 1\n",
        "tests": [f"{UNIT}::test_the_order_is_distributed_samplers_and_the_shares_split_as_documented"],
        "why": "the global order drifts from DistributedSampler's: on one process global_batch_size is no longer batch_size",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            seed_everything(derive_seed(seed, "resume", rank=self.proc.rank, step=state.step))',
        "replace": '            seed_everything(derive_seed(seed, "fresh start", rank=self.proc.rank))',
        "tests": [CHAIN],
        "why": "a resume on another world size starts the fresh start's streams again, whatever the position",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            seed_everything(derive_seed(seed, "resume", rank=self.proc.rank, step=state.step))',
        "replace": '            seed_everything(derive_seed(seed, "resume", rank=self.proc.rank, step=state.step * self.proc.world_size))',
        "tests": [CHAIN],
        "why": "the resumed streams depend on the world size: two resumes of one checkpoint draw differently",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        over_ranks = self.meter.over_ranks(at.window) if self.options.loader.global_batch_size else []",
        "replace": "        over_ranks = []",
        "tests": [CHAIN],
        "why": "the unlogged window is not reduced into state.pt: a resume on another W loses those updates' records",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": "            rows /= self.proc.world_size\n",
        "replace": "",
        "tests": [CHAIN],
        "why": "the window is summed over ranks, not averaged: the resumed record is W times too large",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '            "global_batch_size": global_batch,',
        "replace": '            "global_batch_size": None,',
        "tests": [f"{UNIT}::test_a_changed_global_batch_size_is_refused_naming_both"],
        "why": "the settings compared on resume skip G: 8 and 9 (the same updates per epoch) resume each other",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "        if old is not None and new is not None:",
        "replace": "        if False:",
        "tests": [f"{UNIT}::test_a_changed_global_batch_size_is_refused_naming_both"],
        "why": "a changed G is refused as any setting, without naming both values nor saying it changes the run",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": 'payload["settings"].get("global_batch_size") is None:',
        "replace": 'payload["settings"].get("batch_size") is None:',
        "tests": [REFUSED],
        "why": "the world-size check reads the wrong setting: a batch_size checkpoint resumes on another W",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": '                if payload["world_size"] == self.world_size:\n',
        "replace": '                if payload["world_size"] >= self.world_size:\n',
        "tests": [CHAIN],
        "why": "a shrink reads the ranks' own files as if the job were the same: rank 0's streams and window alone",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": '        if local is not None:\n            restore_rng(local["rng"])',
        "replace": '        if local is not None and not self.options.loader.global_batch_size:\n            restore_rng(local["rng"])',
        "tests": [f"{ANY}::test_on_the_same_number_of_processes_a_global_batch_run_resumes_bit_for_bit"],
        "why": "a global batch's run reseeds also on the same W: dropout no longer resumes bit for bit",
    },
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": "    if g % w:\n",
        "replace": "    if g % w and g < w:\n",
        "tests": [f"{UNIT}::test_what_the_processes_cannot_run_is_named_with_the_numbers_and_the_fix"],
        "why": "W not dividing G is refused only when G < W: ranks read unequal shares of every update",
    },
    {
        "file": "src/composetrain/driver/global_batches.py",
        "find": "    if 0 < short < w:\n",
        "replace": "    if 0 < short < w - 1:\n",
        "tests": [REFUSED],
        "why": "a short update with one sample fewer than processes passes: a rank gets an empty batch",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "local_world_size=proc.local_world_size, equal_shares=can.forward_needs_every_rank,",
        "replace": "local_world_size=proc.local_world_size, equal_shares=False,",
        "tests": [REFUSED],
        "why": "ct.sharded's uneven short update is found at the epoch's last update, after training, not before",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "    shares = isinstance(sampler, GlobalBatches) and not whole",
        "replace": "    shares = False",
        "tests": [f"{UNIT}::test_loader_workers_read_the_samples_the_sequence_says"],
        "why": "loader workers take the shares as a per-sample sampler: the sequence depends on num_workers",
    },
    {
        "file": "src/composetrain/driver/options.py",
        "find": "        if isinstance(self.data, DataLoader) and self.global_batch_size is not None:",
        "replace": "        if isinstance(self.data, DataLoader) and self.batch_size is not None and self.global_batch_size is not None:",
        "tests": [f"{UNIT}::test_arguments_that_do_not_define_the_global_batch_are_refused_before_anything"],
        "why": "a DataLoader with global_batch_size alone is used as given: G silently ignored",
    },
    {
        "file": "src/composetrain/driver/loader.py",
        "find": "        batch_size = sampler.per_rank",
        "replace": "        batch_size = options.global_batch_size",
        "tests": [SAME, CHAIN],
        "why": "the reader's batch size is G, not G/W: records say W*G, a resume skips W times the updates done",
    },
    {
        "file": "src/composetrain/core/state.py",
        "find": "                if k in transforms or isinstance(v, RuntimeState)\n",
        "replace": "                if k in transforms\n",
        "tests": [f"{UNIT}::test_loading_a_checkpoint_keeps_the_live_runtime_state_it_lacks"],
        "why": "a checkpoint of one process drops the live sharding on two: the resumed sharded run refuses its model",
    },
]
