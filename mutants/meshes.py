# ruff: noqa: E501
"""Planted bugs for issue 34 (HSDP, tensor parallel, multi-process pipeline), each caught by the tests named.

The multi-process tests start a pool of 4 ranks (about a minute on 2 loaded cores): a replay of this file takes
a while; the one-process tests catch what they can."""

T = "tests/test_meshes.py"
LAYOUT = f"{T}::test_each_layout_is_the_one_process_large_batch_update"
REFUSE = f"{T}::test_bad_layouts_and_plans_are_refused_on_every_rank_alike"

MUTANTS = [
    {
        "file": "src/composetrain/transforms/pipeline_parallel.py",
        "find": "made = kind(stage, n_microbatches=len(micros), loss_fn=loss_fn, scale_grads=False)",
        "replace": "made = kind(stage, n_microbatches=len(micros), loss_fn=loss_fn)",
        "tests": [f"{LAYOUT}[pp_ddp_gpipe]"],
        "why": "pitfall 43: torch's default scale_grads=True divides the globally weighted gradients again by the micro-batch count",
    },
    {
        "file": "src/composetrain/transforms/pipeline_parallel.py",
        "find": "share = weights[i] / ctx.total_weight  # the global count: never scale_grads' per-step rescale",
        "replace": "share = 1.0 / len(micros)",
        "tests": [f"{LAYOUT}[pp_ddp_gpipe]"],
        "why": "an average of the micro-batches' token means, not the mean over the global token count (torchtitan #1733)",
    },
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": "dist.all_reduce(units, group=place.data_group)  # over the data shards only: a split's ranks share theirs",
        "replace": "dist.all_reduce(units, group=place.world_group)",
        "tests": [f"{LAYOUT}[tp_ddp]"],
        "why": "pitfall 44: token counts summed over the tensor-parallel dimension too: each token counted T times",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "        dist.all_reduce(total, group=self.group)\n",
        "replace": "",
        "tests": [f"{LAYOUT}[pp_ddp_gpipe]"],
        "why": "the clipping norm misses the other stages: each stage clips by its own part (torchtitan #596)",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": "self._elsewhere = {i for i, n in names.items() if plan.holders[n][0] != stage}",
        "replace": "self._elsewhere = set()",
        "tests": [f"{LAYOUT}[pp_ddp_gpipe]"],
        "why": "a weight tied across stages counted in the norm once per stage holding it",
    },
    {
        "file": "src/composetrain/transforms/pipeline_parallel.py",
        "find": "            if ctx.last_backward:  # what every pass of the update added, once (a second sum would add the first twice)\n",
        "replace": "            if True:\n",
        "tests": [f"{LAYOUT}[pp_ddp_gpipe]"],
        "why": "tied gradients added over the stages after every pass: under accumulate the first pass's sum is added twice",
    },
    {
        "file": "src/composetrain/transforms/pipeline_parallel.py",
        "find": "            for t in [*model.parameters(), *model.buffers()]:\n                dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)",
        "replace": "            for t in []:\n                pass",
        "tests": [f"{LAYOUT}[pp_ddp_gpipe]"],
        "why": "each stage keeps its own rank's initial weights: the split model is no one model (and tied copies differ)",
    },
    {
        "file": "src/composetrain/transforms/_mesh.py",
        "find": 'ORDER = ("pp", "replicate", "shard", "dp", "tp")  # outermost first',
        "replace": 'ORDER = ("tp", "pp", "replicate", "shard", "dp")  # outermost first',
        "tests": [f"{LAYOUT}[tp_fsdp]"],
        "why": "mesh dimensions swapped: tensor-parallel groups of ranks r and r + W/T, which read different data shards",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "        return (rank // tp) % count, count",
        "replace": "        return rank % count, count",
        "tests": [f"{T}::test_each_rank_reads_the_data_shard_of_its_mesh_coordinate"],
        "why": "the driver gives a tensor-parallel group's ranks different data shards",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "        return Capabilities(**either, data_ranks=(p * q, t * u))",
        "replace": "        return Capabilities(**either, data_ranks=(p, t))",
        "tests": [f"{T}::test_the_splitting_transforms_tell_the_driver_how_many_ranks_share_a_batch"],
        "why": "a transform's own data_ranks hides its inner steps': sharded(tensor_parallel(...)) looks unsplit",
    },
    {
        "file": "src/composetrain/transforms/_mesh.py",
        "find": "        flat /= size\n",
        "replace": "",
        "tests": [f"{LAYOUT}[tp_ddp]"],
        "why": "distributed's own reduction of a split model sums the replicas' gradients instead of averaging them",
    },
    {
        "file": "src/composetrain/transforms/sharded.py",
        "find": 'mesh = place.sub(tuple(n for n in ("replicate", "shard") if n in dict(place.layout)))',
        "replace": 'mesh = place.sub(("shard",))',
        "tests": [f"{LAYOUT}[hsdp]"],
        "why": "HSDP shards within a replica but never all-reduces across replicas: the replicas part",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "        for t in [*model.parameters(), *model.buffers()]:\n            dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)",
        "replace": "        for t in []:\n            pass",
        "tests": [f"{LAYOUT}[tp_fsdp]"],
        "why": "a tensor-parallel group's ranks keep their own copies of the layers the plan leaves whole (LayerNorms, embeddings)",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "    if active:\n",
        "replace": "    if False:\n",
        "tests": [f"{REFUSE}[dropout]"],
        "why": "dropout under TP trained silently, its split masks not the unsplit layer's",
    },
    {
        "file": "src/composetrain/transforms/tensor_parallel.py",
        "find": "                _check_names(model, self.plan, self)\n",
        "replace": "                pass\n",
        "tests": [f"{REFUSE}[plan_missing]", f"{REFUSE}[plan_kind]"],
        "why": "a plan entry that matches nothing is skipped with torch's warning: the layer trains whole",
    },
    {
        "file": "src/composetrain/transforms/_mesh.py",
        "find": "        made = dist.new_group(row, timeout=timeout) if timeout is not None else dist.new_group(row)",
        "replace": "        made = dist.new_group(row)",
        "tests": [f"{T}::test_every_group_of_the_mesh_waits_as_long_as_the_job_does"],
        "why": "the mesh's groups wait torch's 30 minutes, not the job's timeout, in every send, receive and collective",
    },
    {
        "file": "src/composetrain/transforms/_stages.py",
        "find": 'whole["model"] = {k: model[k] for k in self.plan.paths if k in model}',
        "replace": 'whole["model"] = dict(here["model"])',
        "tests": [f"{T}::test_pipeline_checkpoints_hold_the_unsplit_model_and_resume_on_another_schedule"],
        "why": "a pipeline's checkpoint holds rank 0's stage only: the unsplit model cannot load it",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            rank=self.shard,\n            world_size=self.shards,\n",
        "replace": "            rank=proc.rank,\n            world_size=proc.world_size,\n",
        "tests": [f"{T}::test_tensor_parallel_checkpoints_load_at_another_degree_and_in_one_process"],
        "why": "ct.run gives each rank of a tensor-parallel group its own data: the group computes on mismatched batches",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": "        for params in by_mesh.values():\n            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=foreach)",
        "replace": "        torch.nn.utils.clip_grads_with_norm_(tensors, max_norm, norm, foreach=foreach)",
        "tests": [f"{LAYOUT}[tp_fsdp]"],
        "why": "clipping scales DTensor gradients of several meshes in one foreach call, which DTensor refuses (torchtitan #596's crash)",
    },
    {
        "file": "src/composetrain/core/composition_rules.py",
        "find": '    ("tensor_parallel", "sharded"): "the model is split first, then FSDP shards each piece',
        "replace": '    ("tensor_parallel", "sharded_"): "the model is split first, then FSDP shards each piece',
        "tests": [
            "tests/test_composition_rules.py::test_the_table_holds_exactly_the_orders_that_cannot_be_made_correct",
            "tests/test_composition_table.py",
        ],
        "why": "tensor_parallel(sharded(...)) accepted: FSDP would shard before the plan splits",
    },
    {
        "file": "src/composetrain/checkpoint/loading.py",
        "find": "                mesh.get_group(dim)\n",
        "replace": "                mesh.get_group()\n",
        "tests": [f"{T}::test_full_state_dict_gathers_a_model_on_a_2d_mesh_and_says_gone_only_when_its_group_is"],
        "why": "the group looked up without a dimension: a 2-D mesh (HSDP, TP x FSDP) has none for the whole, and full_state_dict raised",
    },
    {
        "file": "src/composetrain/checkpoint/files.py",
        "find": "                mine = same_ranks(payload, self.world_size, self.data_shards)\n",
        "replace": '                mine = payload["world_size"] == self.world_size\n',
        "tests": [f"{T}::test_a_global_batch_run_splits_it_over_data_shards_and_resumes_on_another_mesh"],
        "why": "a rank's own file restored on another layout of as many processes: a TP pair resumes with two shards' random streams",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": "    if not same_ranks(payload, world_size, data_shards):\n",
        "replace": "    if False:\n",
        "tests": [
            f"{T}::test_a_global_batch_run_splits_it_over_data_shards_and_resumes_on_another_mesh",
            "tests/test_checkpoint_format.py::test_a_rank_file_continues_only_on_processes_reading_the_same_data_shards",
        ],
        "why": "a batch_size run (per-rank order and random states) resumed on another layout of its processes without a word",
    },
    {
        "file": "src/composetrain/checkpoint/format.py",
        "find": '    return payload["data_shards"] or list(range(payload["world_size"]))',
        "replace": '    return payload["data_shards"]',
        "tests": [
            "tests/test_checkpoint_format.py::test_a_rank_file_continues_only_on_processes_reading_the_same_data_shards"
        ],
        "why": "a checkpoint written before the stamp (no data_shards) never continues its ranks' own files",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "                data_shards=[can.data_shard(r, proc.world_size)[0] for r in range(proc.world_size)],\n",
        "replace": "",
        "tests": [f"{T}::test_a_global_batch_run_splits_it_over_data_shards_and_resumes_on_another_mesh"],
        "why": "the driver stamps rank r as shard r whatever the mesh: a layout change at the same W goes unseen",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": "            per_shard=proc.world_size // self.shards,\n",
        "replace": "",
        "tests": [f"{REFUSE}[global_batch_tp]"],
        "why": "a global batch refused under TP counts its data shards as processes: '2 processes' on a job of 4",
    },
    {
        "file": "src/composetrain/driver/run.py",
        "find": 'record["global_batch"] = None if batch is None else batch * self.shards',
        "replace": 'record["global_batch"] = None if batch is None else batch * self.proc.world_size',
        "tests": [f"{T}::test_a_global_batch_run_splits_it_over_data_shards_and_resumes_on_another_mesh"],
        "why": "the logged global batch (ct.scaled_lr's input) counts a TP pair's or a pipeline's shared shard twice",
    },
]
