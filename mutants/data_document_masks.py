"""The planted bugs of src/composetrain/data/document_masks.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/data/document_masks.py",
        "find": "    rows = (ids if ids.ndim == 2 else ids.unsqueeze(0)).clone()",
        "replace": "    rows = ids if ids.ndim == 2 else ids.unsqueeze(0)",
        "tests": [
            "tests/test_pack.py::test_the_block_mask_keeps_the_ids_it_was_built_from",
        ],
        "why": (
            "the block mask's mask_mod reads a reused buffer's later ids while its skipped blocks stay the old ones"
        ),
        "from": "adv33",
    },
    {
        "file": "src/composetrain/data/document_masks.py",
        "find": "    mask = (ids.unsqueeze(-1) == ids.unsqueeze(-2)) & causal",
        "replace": "    mask = ids.unsqueeze(-1) == ids.unsqueeze(-2)",
        "tests": [
            "tests/test_pack.py::test_document_mask_lets_a_position_see_its_own_document_up_to_itself",
            "tests/test_pack_gpt.py::test_a_packed_batch_gives_each_document_the_losses_and_gradients_it_has_alone",
        ],
        "why": "attention inside a document but not causal: a token sees the tokens it predicts",
        "from": "tokens",
    },
    {
        "file": "src/composetrain/data/document_masks.py",
        "find": "        return (rows[b, q] == rows[b, kv]) & (q >= kv)",
        "replace": "        return q >= kv",
        "tests": [
            "tests/test_pack.py::test_the_block_mask_attends_as_the_boolean_mask",
        ],
        "why": "the BlockMask is only causal: packed documents attend across their boundaries",
        "from": "tokens",
    },
]
