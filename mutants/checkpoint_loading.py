"""The planted bugs of src/composetrain/checkpoint/loading.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/checkpoint/loading.py",
        "find": "    problem = problem or mismatch(folder, STATE_FILE, sums)\n",
        "replace": "",
        "tests": [
            "tests/test_checkpoint_trust.py::test_load_checkpoint_refuses_a_flipped_bit",
        ],
        "why": "29.12: ct.load_checkpoint never verifies",
        "from": "issue29_run",
    },
    {
        "file": "src/composetrain/checkpoint/loading.py",
        "find": "                mesh.get_group(dim)\n",
        "replace": "                mesh.get_group()\n",
        "tests": [
            "tests/test_meshes.py::test_full_state_dict_gathers_a_model_on_a_2d_mesh_and_says_gone_only_when_its_group_is",
        ],
        "why": (
            "the group looked up without a dimension: a 2-D mesh (HSDP, TP x FSDP) has none for the whole, and "
            "full_state_dict raised"
        ),
        "from": "meshes",
    },
]
