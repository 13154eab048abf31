"""Planted bugs for issue 20's behaviours, each caught by the test named for it (see tools/mutants.py)."""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/sharded.py",
        "find": "state._unheld = [now[names[id(p)]] for p in state._unheld]",
        "replace": "state._unheld = list(state._unheld)",
        "tests": [
            "tests/test_sharded_setup.py::"
            "test_a_parameter_outside_the_optimizer_unfrozen_later_has_its_gradient_cleared"
        ],
        "why": "20.1: the parameters outside the optimizer still name the unsharded ones: their .grad is never cleared",
    },
    {
        "file": "src/composetrain/checkpoint/shards.py",
        "find": "FileSystemWriter(folder / SHARDS, sync_files=True)",
        "replace": "FileSystemWriter(folder / SHARDS, sync_files=False)",
        "tests": [
            "tests/test_sharded_checkpoint_files.py::test_shard_files_and_metadata_are_fsynced_before_the_rename"
        ],
        "why": "20.2: the shard files are not fsynced before the folder's rename",
    },
    {
        "file": "src/composetrain/checkpoint/shards.py",
        "find": 'params = [p for g in self.state.optimizer.param_groups for p in g["params"]]',
        "replace": "params = list(self.state.model.parameters())",
        "tests": [
            "tests/test_sharded_setup.py::test_resume_and_load_are_bit_exact_with_the_optimizer_in_another_order"
        ],
        "why": "20.3: optimizer state numbered in model.parameters() order, not the optimizer's",
    },
    {
        "file": "src/composetrain/transforms/_shard_units.py",
        "find": 'ordered = sorted(units, key=lambda n: -n.count("."))',
        "replace": 'ordered = sorted(units, key=lambda n: n.count("."))',
        "tests": ["tests/test_shard_unit_ties.py"],
        "why": "20.4: the outermost unit owns a parameter: a weight tied between nested units passes",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": "            p.grad = grad.clone()\n",
        "replace": "            p.grad = grad\n",
        "tests": [
            "tests/test_auto_accumulate_undo.py::"
            "test_an_oom_in_a_later_micro_batch_restores_the_gradients_from_before_the_call"
        ],
        "why": "20.5: a retry gets the saved gradients themselves, which the next attempt's backward adds into",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": "self.grads = [(p, p.grad.clone()) for p in params if p.grad is not None]",
        "replace": "self.grads = [(p, p.grad) for p in params if p.grad is not None]",
        "tests": [
            "tests/test_auto_accumulate_undo.py::"
            "test_an_oom_in_the_first_attempt_after_a_backward_restores_the_gradients_from_before_the_call"
        ],
        "why": "20.5: the gradients from before the call kept as aliases, which the first attempt's backward adds into",
    },
    {
        "file": "src/composetrain/transforms/_deferred_sync.py",
        "find": "params = [p for p in self.ddp.module.parameters() if p.requires_grad and p.grad is not None]",
        "replace": "params = [p for p in self.ddp.module.parameters() if p.requires_grad]",
        "tests": ["tests/test_auto_unused_parameters.py"],
        "why": "20.6: the deferred sync gives a never-used parameter a zero gradient (momentum, decay move it)",
    },
    {
        "file": "src/composetrain/transforms/_scaling.py",
        "find": "carried = self.scaler.state_dict() if mode == self.mode else None",
        "replace": "carried = self.scaler.state_dict() if mode == self.mode and device == self.device else None",
        "tests": ["tests/test_loss_scale_moves.py"],
        "why": "20.7: a model moved to another device type restarts its loss scale at 2**16",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "return max(0, min(8, cores // max(1, local_world_size) - 1))",
        "replace": "return max(0, min(8, cores - 1))",
        "tests": ["tests/test_auto_workers.py"],
        "why": "20.8: num_workers='auto' gives every process of the node the whole node's cores",
    },
    {
        "file": "src/composetrain/core/rng.py",
        "find": '"gauss": gauss}',
        "replace": '"gauss": None}',
        "tests": ["tests/test_rng_streams.py::test_the_cached_gaussian_is_in_the_saved_state"],
        "why": "20.9: Python's cached Gaussian is dropped from the checkpoint",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": 'if payload["world_size"] != world_size:',
        "replace": 'if payload["world_size"] < world_size:',
        "tests": ["tests/test_checkpoint_folder.py::test_a_checkpoint_of_two_processes_is_refused_in_one_and_kept"],
        "why": "20.10: a checkpoint of more processes than the run has is resumed",
    },
    {
        "file": "src/composetrain/driver/monitor.py",
        "find": 'purge = step if resumed else 0 if any(self.tensorboard.glob("*tfevents*")) else None',
        "replace": 'purge = step + 1 if resumed else 0 if any(self.tensorboard.glob("*tfevents*")) else None',
        "tests": [
            "tests/test_tensorboard_resume.py::test_a_run_resumed_after_a_crash_past_its_checkpoint_has_each_step_once"
        ],
        "why": "20.11: TensorBoard's purge keeps the resumed step, which is written back: shown twice",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": 'seed_everything(derive_seed(seed, "fresh start", rank=self.shard))',
        "replace": 'seed_everything(derive_seed(seed, "fresh start", rank=0))',
        "tests": ["tests/test_rng_streams.py::test_each_rank_draws_its_own_streams_on_a_fresh_start"],
        "why": "20.12: every rank seeded alike: the ranks draw the same random numbers",
    },
    {
        "file": "src/composetrain/plot.py",
        "find": '"loss", "global_batch"}',
        "replace": '"loss"}',
        "tests": ["tests/test_plot_inputs.py::test_the_log_of_a_real_run_draws_its_metrics_and_no_bookkeeping"],
        "why": "20.13: the plot draws ct.run's global_batch bookkeeping as a metric",
    },
    {
        "file": "src/composetrain/driver/reader.py",
        "find": "self.sampler.start += done * self.batch_size",
        "replace": "self.sampler.start = done * self.batch_size",
        "tests": ["tests/test_data.py::test_a_run_stopped_after_any_update_resumes_bit_identically"],
        "why": "20.14: the workers that take over part-way forget the resumed position",
    },
]
