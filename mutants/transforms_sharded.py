"""The planted bugs of src/composetrain/transforms/sharded.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
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
