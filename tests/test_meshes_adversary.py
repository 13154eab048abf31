"""What the issue-34 adversary found in HSDP, tensor parallel and multi-process pipelines, on 4 spawned gloo
processes (one pool, one launch per test, several checks each): a pipeline stage with no gradient (frozen) or no
parameter at all, ``ct.ema`` over a pipeline whose embedding is tied to its head, tensor-parallel plans that split a
tied weight or meet one submodule with two styles, and ranks that disagree on the mesh's shape. Each numerical check is
against the one-process large-batch update in float64 (the model and data of ``test_meshes``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_meshes import (
    MAX_NORM,
    STAGES,
    UPDATES,
    Block,
    Embed,
    Head,
    assert_close_to,
    global_batch,
    gpt,
    plan,
    shard_of,
    step,
    tokens,
    whole,
)
from torch import nn

import composetrain as ct

WORLD = 4


def frozen_front(seed: int = 0) -> nn.Sequential:
    """The test model with its first stage's submodules frozen (the embedding, so the tied head too): that stage's
    processes have no gradient at all."""
    model = gpt(seed)
    for p in [*model[0].parameters(), *model[1].parameters()]:
        p.requires_grad_(False)
    return model


def with_identity(seed: int = 0) -> nn.Sequential:
    """The test model with an nn.Identity between the blocks: a stage of its own holds no parameter."""
    torch.manual_seed(seed)
    embed = Embed()
    return nn.Sequential(embed, Block(), nn.Identity(), Block(), Head(embed)).double()


MODELS = {"frozen_front": (frozen_front, STAGES), "identity": (with_identity, [["0"], ["1"], ["2"], ["3", "4"]])}


def sgd(model: nn.Module, ema: bool = False) -> ct.TrainState:
    return ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-3))


def reference(build: Any, ema: float | None = None) -> dict[str, Any]:
    state = sgd(build())
    train = ct.clip_grad_norm(MAX_NORM)(step)
    train = ct.ema(ema)(train) if ema is not None else train
    outs = [train(state, global_batch(i)) for i in range(UPDATES)]
    found = {
        "params": {k: whole(v) for k, v in state.state_dict()["model"].items()},
        "norms": [float(o.metrics["grad_norm"]) for o in outs],
    }
    if ema is not None:
        found["ema"] = {k: whole(v) for k, v in ct.ema_model(state).state_dict().items()}
        found["ema_keys"] = sorted(state.state_dict()["transforms"]["ema"]["averages"])
    return found


def trained(rank: int, train: ct.TrainStep, state: ct.TrainState) -> dict[str, Any]:
    index, count = train.capabilities.data_shard(rank, WORLD)
    outs = [train(state, shard_of(global_batch(i), index, count)) for i in range(UPDATES)]
    return {
        "params": {k: whole(v) for k, v in state.state_dict()["model"].items()},
        "norms": [float(whole(o.metrics["grad_norm"])) for o in outs],
    }


# -- rank functions (pool.run("test_meshes_adversary", ...)) ---------------------------------------------------------


def stages_without_gradients(rank: int, world: int) -> dict[str, Any]:
    """PP 2 x DP 2 with the first stage frozen, and PP 4 whose third stage is an nn.Identity, each clipped (the norm's
    all-reduce over the stages) with a weight tied across the stages (its gradients' all-reduce)."""
    found = {}
    for name, (build, stages) in MODELS.items():
        micro = ct.pipeline(stages, microbatches=len(stages))(step)
        train = ct.distributed(ct.clip_grad_norm(MAX_NORM)(ct.accumulate(2, weight=tokens)(micro)))
        state = sgd(build(seed=rank))
        found[name] = trained(rank, train, state)
        state.release_runtime()
    return found


def pipeline_ema(rank: int, world: int) -> dict[str, Any]:
    """PP 2 x DP 2 under ct.ema: the averages gathered into the unsplit model, and the checkpoint's averages by the
    unsplit model's names (the head's tied weight is the embedding's there)."""
    pipe = ct.pipeline(STAGES, microbatches=2)(step)
    train = ct.distributed(ct.ema(0.5)(ct.clip_grad_norm(MAX_NORM)(ct.accumulate(2, weight=tokens)(pipe))))
    state = sgd(gpt(rank))
    found = trained(rank, train, state)
    found["ema"] = {k: whole(v) for k, v in ct.ema_model(state, into=gpt()).state_dict().items()}
    saved = state.state_dict()
    found["ema_keys"] = sorted(saved["transforms"]["ema"]["averages"])
    loaded = sgd(gpt())  # the checkpoint loads into the unsplit model under ct.ema, in one process
    loaded.load_state_dict(saved)
    found["loaded_ema"] = {k: whole(v) for k, v in ct.ema_model(loaded).state_dict().items()}
    again = sgd(gpt(rank))  # and back into the stages: each takes its part, the head's tied average by its own name
    ct.apply_sharding(train, again)
    again.load_state_dict(saved)
    found["reloaded_ema"] = {k: whole(v) for k, v in ct.ema_model(again, into=gpt()).state_dict().items()}
    state.release_runtime()
    again.release_runtime()
    return found


def tied_and_conflicting_plans(rank: int, world: int) -> dict[str, Any]:
    """What TP 2 x FSDP 2 raises for plans that split a weight tied to another module's (as a mapping, and as a
    function), and for one submodule matched by two keys with different styles; whether the model, the optimizer
    and the step were left as they were."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    head = {**plan(), "3.proj": ColwiseParallel(output_layouts=Replicate())}

    def tying_plan(model: nn.Module, tp_mesh: Any) -> None:
        parallelize_module(model, tp_mesh, head)

    plans = {
        "head": head,
        "embedding": {**plan(), "0.tokens": RowwiseParallel(input_layouts=Replicate())},
        "conflict": {**plan(), "1.q": RowwiseParallel()},
        "function": tying_plan,
    }
    found = {}
    for case, chosen in plans.items():
        state = sgd(gpt(rank))
        before = {k: v.clone() for k, v in state.model.state_dict().items()}
        train = ct.sharded(ct.tensor_parallel(chosen, size=2)(ct.clip_grad_norm(MAX_NORM)(step)), modules=Block)
        index, count = train.capabilities.data_shard(rank, WORLD)
        try:
            train(state, shard_of(global_batch(0), index, count))
            found[case] = {"error": "no error"}
        except Exception as e:
            found[case] = {"error": f"{type(e).__name__}: {e}"}
        after = state.model.state_dict()
        found[case]["unchanged"] = state.step == 0 and all(
            not hasattr(after[k], "device_mesh") and torch.equal(after[k], v) for k, v in before.items()
        )
        found[case]["optimizer_unchanged"] = not state.optimizer.state and all(
            not hasattr(p, "device_mesh") for g in state.optimizer.param_groups for p in g["params"]
        )
        found[case]["unusable"] = state.unusable
        state.release_runtime()
    return found


def disagreeing_layouts(rank: int, world: int) -> dict[str, Any]:
    """What one update raises where one rank builds another layout than the others (another replicate=, a
    replicate= that does not divide the world on that rank only, tensor_parallel's size 1 (no mesh) on one rank,
    another number of stages, HSDP beside plain FSDP), and whether its model stayed as it was."""
    weighted = ct.accumulate(2, weight=tokens)
    cases = {
        "replicate": lambda: ct.sharded(weighted(step), replicate=4 if rank == 0 else 2),
        "replicate_3": lambda: ct.sharded(weighted(step), replicate=3 if rank == 0 else 2),
        "tp_size": lambda: ct.sharded(ct.tensor_parallel(plan(), size=1 if rank == 3 else 2)(weighted(step))),
        "stages": lambda: ct.distributed(
            ct.pipeline([["0"], ["1"], ["2"], ["3"]] if rank == 0 else STAGES, microbatches=4)(step)
        ),
        "hsdp_beside_fsdp": lambda: ct.sharded(weighted(step), replicate=2 if rank == 1 else None),
        "pipeline_beside_ddp": lambda: ct.distributed(
            ct.pipeline(STAGES, microbatches=2)(step) if rank == 2 else weighted(step)
        ),
    }
    found = {}
    for case, build in cases.items():
        train = build()
        state = sgd(gpt(rank))
        before = {k: v.clone() for k, v in state.model.state_dict().items()}
        try:
            index, count = train.capabilities.data_shard(rank, WORLD)
        except ValueError:
            index, count = 0, 1
        try:
            train(state, shard_of(global_batch(0), index, count))
            found[case] = "no error"
        except Exception as e:
            found[case] = f"{type(e).__name__}: {e}"
        after = state.model.state_dict()
        if state.step != 0 or any(not torch.equal(after[k], v) for k, v in before.items()):
            found[case] += " (and the model changed)"
        state.release_runtime()
    return found


def crafted_checkpoint(rank: int, world: int, checkpoint: str) -> dict[str, Any]:
    """PP 2 x DP 2 laid out, then a checkpoint whose '1.q.weight' (the first stage's) has the wrong shape loaded:
    what each rank raised, and whether its own part (parameters, optimizer, step) stayed as it was."""
    train = ct.distributed(ct.clip_grad_norm(MAX_NORM)(ct.pipeline(STAGES, microbatches=2)(step)))
    state = sgd(gpt(rank))
    ct.apply_sharding(train, state)
    before = {k: v.clone() for k, v in state.model.state_dict().items()}
    try:
        ct.load_checkpoint(state, checkpoint)
        found = {"error": "no error"}
    except Exception as e:
        found = {"error": f"{type(e).__name__}: {e}"}
    after = state.model.state_dict()
    found["unchanged"] = (
        state.step == 0 and not state.optimizer.state and all(torch.equal(after[k], v) for k, v in before.items())
    )
    state.release_runtime()
    return found


# -- the tests ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    from processes import Pool

    p = Pool(WORLD)
    yield p
    if p.broken is None:
        p.close()
    else:
        p.kill()


def test_a_stage_without_gradients_or_parameters_is_the_plain_step(pool):
    # each had gloo abort the process: a stage with no gradient sent its norm in float32 to stages sending float64,
    # and a stage without parameters sent the tied weight's zeros in float32
    results = pool.run("test_meshes_adversary", "stages_without_gradients", timeout=300)
    for name, (build, _) in MODELS.items():
        ref = reference(build)
        for rank, found in enumerate(results):
            print(f"{name} rank {rank}: {assert_close_to(found[name], ref)}")
            assert found[name]["norms"] == pytest.approx(ref["norms"], rel=1e-12)
            assert min(found[name]["norms"]) > MAX_NORM  # clipping active


def test_a_pipeline_ema_with_a_tied_weight_keeps_the_unsplit_models_names(pool):
    # the head's stage named the tied weight's average by its own path: ema_model(into=) refused the unsplit model,
    # and a checkpoint held an average the unsplit model does not have
    results = pool.run("test_meshes_adversary", "pipeline_ema", timeout=300)
    ref = reference(gpt, ema=0.5)
    for rank, found in enumerate(results):
        print(f"rank {rank}: {assert_close_to(found, ref)}")
        assert found["ema_keys"] == ref["ema_keys"]
        for got in (found["ema"], found["loaded_ema"], found["reloaded_ema"]):
            for k, v in ref["ema"].items():
                torch.testing.assert_close(got[k], v, rtol=1e-12, atol=1e-14)


def test_plans_that_break_a_tie_or_meet_a_submodule_twice_are_refused(pool):
    # each trained silently apart: the split copy of a tied weight and the whole one (the update off by 6e-3 here),
    # or only the later of two styles for one submodule
    results = pool.run("test_meshes_adversary", "tied_and_conflicting_plans", timeout=300)
    for found in results:
        for case in ("head", "embedding"):
            assert (
                "tied weights" in found[case]["error"]
                and "leave the tied modules out of the plan" in found[case]["error"]
            ), found[case]
            assert found[case]["unchanged"] and found[case]["optimizer_unchanged"], found[case]
        assert "plan['3.proj'] (ColwiseParallel) splits '3.proj.weight'" in found["head"]["error"]
        assert "['0.tokens.weight']" in found["head"]["error"]
        assert "plan['0.tokens'] (RowwiseParallel) splits '0.tokens.weight'" in found["embedding"]["error"]
        conflict = found["conflict"]["error"]
        assert "plan['[12].q'] (ColwiseParallel) and plan['1.q'] (RowwiseParallel) both match '1.q'" in conflict
        assert found["conflict"]["unchanged"] and found["conflict"]["optimizer_unchanged"]
        # a function is only seen at work: refused after it, and the state says it cannot train
        assert "tying_plan" in found["function"]["error"] and "tie broke" in found["function"]["error"]
        assert "build a fresh TrainState" in (found["function"]["unusable"] or "")


def test_ranks_that_lay_out_the_job_differently_are_refused_on_every_rank_before_any_group(pool):
    # each hung (until the pool's timeout, past the job's) or had gloo abort: the ranks made different groups
    results = pool.run("test_meshes_adversary", "disagreeing_layouts", timeout=150)
    for rank, found in enumerate(results):
        for case, error in found.items():
            assert error.startswith("ValueError") and "changed" not in error, (rank, case, error)
            if case == "replicate_3" and rank == 0:  # its own refusal: the sizes that divide
                assert "replicate=3" in error and "divisors of 4" in error
                continue
            assert "the ranks lay out the job differently" in error, (rank, case, error)
        assert "rank 0: (replicate=4, shard=1); rank 1: (replicate=2, shard=2)" in found["replicate"]
        assert "rank 0: refused it (see its error)" in found["replicate_3"] or rank == 0
        assert "rank 3: no mesh" in found["tp_size"] and "rank 0: (shard=2, tp=2)" in found["tp_size"]
        assert "rank 0: (pp=4, dp=1)" in found["stages"] and "rank 1: (pp=2, dp=2)" in found["stages"]
        assert "rank 0: no mesh; rank 1: (replicate=2, shard=2)" in found["hsdp_beside_fsdp"]
        assert "rank 2: (pp=2, dp=2)" in found["pipeline_beside_ddp"]


def test_a_checkpoint_one_stage_refuses_is_loaded_by_no_stage(pool, tmp_path):
    # the second stage's processes loaded the checkpoint (step 2, their optimizer state) while the first stage's
    # refused it: a job half resumed
    from test_meshes import BATCH, RUN, dataset

    from composetrain.checkpoint.checksums import digest, write_sums

    state = sgd(gpt())
    ct.run(
        ct.clip_grad_norm(MAX_NORM)(step),
        state,
        dataset(),
        batch_size=BATCH,
        max_steps=1,
        checkpoint_dir=tmp_path,
        **RUN,
    )
    folder = tmp_path / "step-000000001"
    crafted = 0
    for path in folder.glob("*.pt"):
        saved = torch.load(path, weights_only=False)
        holders = [saved] if isinstance(saved, dict) else []
        while holders:  # the model's state dict, wherever the file nests it
            d = holders.pop()
            if "1.q.weight" in d:
                d["1.q.weight"] = d["1.q.weight"][:4]
                torch.save(saved, path)
                crafted += 1
                break
            holders += [v for v in d.values() if isinstance(v, dict)]
    assert crafted == 1
    write_sums(folder, {p.name: digest(p) for p in folder.glob("*.pt")})
    results = pool.run("test_meshes_adversary", "crafted_checkpoint", str(folder), timeout=300)
    for rank, found in enumerate(results):
        assert found["unchanged"], (rank, found)
        assert "1.q.weight: (4, 8) vs (8, 8)" in found["error"], (rank, found)
        if rank >= 2:  # the second stage (ranks 2 and 3): told why, by the first
            assert "pipeline stage 0 refused its part of the checkpoint" in found["error"], found
