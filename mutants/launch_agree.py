"""The planted bugs of src/composetrain/launch/agree.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/launch/agree.py",
        "find": "hashlib.blake2b(repr(value).encode()",
        "replace": "hashlib.blake2b(repr(type(value)).encode()",
        "tests": [
            "tests/test_agree.py::test_differing_gathers_exactly_when_the_reprs_differ",
        ],
        "why": (
            "the digest is over the wrong value (its type): ranks holding different values of one type pass as agreeing"
        ),
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/launch/agree.py",
        "find": "bounds = torch.tensor([digest, -digest]",
        "replace": "bounds = torch.tensor([digest, digest]",
        "tests": [
            "tests/test_agree.py::test_two_ranks_agree_alike_on_the_default_group_and_on_their_own",
        ],
        "why": (
            "the smallest digest is not negated: the bounds never match, and ranks that agree are told they differ"
        ),
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/launch/agree.py",
        "find": ("    if largest_ == -minus_smallest:\n        return None\n"),
        "replace": "",
        "tests": [
            "tests/test_agree.py::test_two_ranks_agree_alike_on_the_default_group_and_on_their_own",
        ],
        "why": "the values are gathered (and reported as differing) even when every rank holds the same",
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/launch/agree.py",
        "find": ("    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)\n    return int(value.item())"),
        "replace": ("    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)\n    return int(value.item())"),
        "tests": [
            "tests/test_agree.py::test_two_ranks_agree_alike_on_the_default_group_and_on_their_own",
        ],
        "why": "fewest takes the most updates: the rank with fewer batches runs out and the others hang in DDP",
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/launch/agree.py",
        "find": "    dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=group)",
        "replace": "    dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=group)",
        "tests": [
            "tests/test_agree.py::test_two_ranks_agree_alike_on_the_default_group_and_on_their_own",
        ],
        "why": "Context.agree sums the ranks' values: a micro-batch size adopted by all is the sum of theirs",
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/launch/agree.py",
        "find": ("    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)\n    return bool(value.item())"),
        "replace": ("    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)\n    return bool(value.item())"),
        "tests": [
            "tests/test_agree.py::test_two_ranks_agree_alike_on_the_default_group_and_on_their_own",
        ],
        "why": "all_true holds when one rank's flag does: a checkpoint saved when one rank could not write its part",
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/launch/agree.py",
        "find": ("    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)\n    return bool(value.item())"),
        "replace": ("    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)\n    return bool(value.item())"),
        "tests": [
            "tests/test_agree.py::test_two_ranks_agree_alike_on_the_default_group_and_on_their_own",
        ],
        "why": "any_true needs every rank's flag: a pre-empted rank stops alone, the others wait for it",
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/launch/agree.py",
        "find": "    return box[0]\n",
        "replace": "    return value\n",
        "tests": [
            "tests/test_agree.py::test_two_ranks_agree_alike_on_the_default_group_and_on_their_own",
        ],
        "why": "from_rank0 returns each rank's own value: the ranks decide on what they each see",
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/launch/agree.py",
        "find": "    dist.all_gather_object(values, value, group=group)\n",
        "replace": "    values[dist.get_rank(group)] = value\n",
        "tests": [
            "tests/test_agree.py::test_two_ranks_agree_alike_on_the_default_group_and_on_their_own",
        ],
        "why": "gathered fills in this rank's value only: the others' are None",
        "from": "agreement_rng",
    },
    {
        "file": "src/composetrain/launch/agree.py",
        "find": ("    if not (dist.is_available() and dist.is_initialized()):\n        return 1\n"),
        "replace": "",
        "tests": [
            "tests/test_agree.py::test_alone_every_function_answers_with_this_process_value",
        ],
        "why": "a single process without a process group asks torch.distributed for its world size, and fails",
        "from": "agreement_rng",
    },
]
