"""The planted bugs of examples/finetune_hf.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "examples/finetune_hf.py",
        "find": "ct.accumulate(args.accumulate, weight=ct.shifted_tokens()),",
        "replace": "ct.accumulate(args.accumulate, weight=lambda b: (b['labels'] != IGNORE).sum()),",
        "tests": [
            "tests/test_examples.py::test_the_hf_finetune_trains_in_bf16_and_resumes_bit_exactly",
        ],
        "why": "25.13: the example falls back to the unshifted count",
        "from": "issue25_hf",
    },
]
