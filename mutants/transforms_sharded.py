"""The planted bugs of src/composetrain/transforms/sharded.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/sharded.py",
        "find": "agreed_layout(state, lambda: self._layout(world), self, self.group)  # once: before any other",
        "replace": "None  # once: before any other",
        "tests": [
            "tests/test_meshes_adversary.py::test_ranks_that_lay_out_the_job_differently_are_refused_on_every_rank_before_any_group",
        ],
        "why": (
            "HSDP on one rank beside plain FSDP on the others: one builds a mesh while the others all-gather counts"
        ),
        "from": "adv34",
    },
    {
        "file": "src/composetrain/transforms/sharded.py",
        "find": 'mesh = place.sub(tuple(n for n in ("replicate", "shard") if n in dict(place.layout)))',
        "replace": 'mesh = place.sub(("shard",))',
        "tests": [
            "tests/test_meshes.py::test_each_layout_is_the_one_process_large_batch_update[hsdp]",
        ],
        "why": "HSDP shards within a replica but never all-reduces across replicas: the replicas part",
        "from": "meshes",
    },
    {
        "file": "src/composetrain/transforms/sharded.py",
        "find": "state._unheld = [now[names[id(p)]] for p in state._unheld]",
        "replace": "state._unheld = list(state._unheld)",
        "tests": [
            "tests/test_sharded_setup.py::test_a_parameter_outside_the_optimizer_unfrozen_later_has_its_gradient_cleared",
        ],
        "why": (
            "20.1: the parameters outside the optimizer still name the unsharded ones: their .grad is never cleared"
        ),
        "from": "issue20",
    },
    {
        "file": "src/composetrain/transforms/sharded.py",
        "find": "/ world).to(p.dtype) if count.real > 0 else None",
        "replace": "/ count.real).to(p.dtype) if count.real > 0 else None",
        "tests": [
            "tests/test_sharded_setup.py::test_zero_dim_parameters_and_adagrad_give_the_plain_update",
        ],
        "why": "a 0-dim gradient some ranks lack averaged over the ranks that have one, not over all",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/transforms/sharded.py",
        "find": "        remake_initial_state(state.optimizer)\n",
        "replace": "        pass\n",
        "tests": [
            "tests/test_sharded_setup.py::test_zero_dim_parameters_and_adagrad_give_the_plain_update",
        ],
        "why": "Adagrad's __init__ state left keyed by the unsharded parameters",
        "from": "issue19",
    },
]
