"""ct.ema on two gloo ranks: the same average on every rank under distributed, an average of the shards under
sharded (DTensors, gathered whole by ct.ema_model, checkpointed), both the one-process average on the whole batch."""

import ema_workers
import pytest
import torch


@pytest.mark.parametrize("kind", ["distributed", "ema outside sharded", "ema inside sharded"])
def test_the_average_over_ranks_is_the_one_process_average(pool, kind):
    ranks = pool.run("ema_workers", "run_case", kind)
    one = ema_workers.train(kind, None)
    for got in ranks:
        assert got["n_averaged"] == one["n_averaged"] == 2
        assert got["kinds"] == (["DTensor"] if "sharded" in kind else ["Tensor"])
        for k, v in one["ema"].items():
            torch.testing.assert_close(got["ema"][k], v, rtol=1e-12, atol=1e-14, msg=k)
    for k, v in ranks[0]["ema"].items():
        assert torch.equal(ranks[1]["ema"][k], v), k  # every rank the same
    if "sharded" in kind:
        assert all(
            "ema_model: the averages are sharded (ct.sharded); give a plain model" in r["refused"] for r in ranks
        )
        assert all(r["resumed"] for r in ranks)


@pytest.mark.parametrize("kind", ["distributed", "sharded"])
def test_ct_run_resumed_mid_epoch_on_two_ranks_ends_with_the_same_average_and_schedule(pool, tmp_path, kind):
    for got in pool.run("ema_workers", "run_resumed", kind, str(tmp_path)):
        straight, resumed = got["straight"], got["resumed"]
        assert straight["scheduler"] == resumed["scheduler"] and straight["scheduler"]["last_epoch"] == 3
        for k, v in straight["ema"].items():
            assert torch.equal(resumed["ema"][k], v), k
        assert resumed["evals"] == straight["evals"]
        if kind == "distributed":
            assert [set(e["eval_ema"]) for e in straight["evals"]] == [{"loss"}] * 3


@pytest.mark.parametrize("kind", ["distributed", "sharded"])
def test_ranks_that_average_differently_are_refused_by_ct_run_before_the_first_update(pool, kind):
    """Each rank would keep its own average (the checkpoint rank 0's, an evaluation their mean), silently."""
    for got in pool.run("ema_workers", "run_disagreeing", kind):
        assert "the ranks' ct.ema differ: rank 0 ema(0.9), rank 1 ema(0.95)" in got, got


def test_under_distributed_batchnorm_statistics_are_averaged_per_rank_as_documented(pool):
    """DDP broadcasts rank 0's buffers at each forward, which then updates them from the rank's own batch: the
    averages of the parameters are the same on every rank, those of BatchNorm's running statistics each rank's own
    (a checkpoint keeps rank 0's; README Known limits, ct.ema's docstring)."""
    ranks = pool.run("ema_workers", "run_batchnorm")
    for k, v in ranks[0].items():
        assert torch.equal(ranks[1][k], v) == (k not in ("1.running_mean", "1.running_var")), k


def test_ct_ema_on_one_rank_only_is_refused_on_every_rank_before_the_setup(pool):
    """Was: rank 0's agreement collective met rank 1's next one: a 60 s gloo timeout, then unclear errors."""
    for got in pool.run("ema_workers", "run_ema_on_one_rank", timeout=60):
        assert "run: the ranks' train steps apply different transforms: rank 0 ['distributed', 'ema'], rank 1 " in got
