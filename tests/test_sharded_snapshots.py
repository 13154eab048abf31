"""What ct.full_state_dict returns for a sharded model is a snapshot, not a view of the live model."""


def test_full_state_dict_does_not_change_when_training_goes_on(pool):
    """0-dim parameters (kept whole beside FSDP2's shards) and buffers were returned as the live tensors
    themselves: the exported weights kept changing as training went on."""
    first, other = pool.run("sharded_snapshot_workers", "full_state_dict_is_a_copy")
    assert first["keys"] == [
        "blocks.0.bias",
        "blocks.0.weight",
        "blocks.1.bias",
        "blocks.1.weight",
        "logit_scale",
        "seen",
    ]
    assert first["changed_since"] == [], first
    assert first["trained_on"] == first["keys"]  # the second update did change every one of them
    assert other == {"keys": [], "changed_since": [], "trained_on": []}  # rank 0 gets the tensors
