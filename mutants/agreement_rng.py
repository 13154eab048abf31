# ruff: noqa: E501
"""Planted bugs for issue 31 item 3: the one owner of rank agreement (launch/agree.py), the one in-memory snapshot
of the generators (core.rng.Generators) and the one derivation of a run's seeds (core.rng.derive_seed); each
caught by the tests named."""

AGREE = "src/composetrain/launch/agree.py"
RNG = "src/composetrain/core/rng.py"
RANKS = "tests/test_agree.py::test_two_ranks_agree_alike_on_the_default_group_and_on_their_own"
REPRS = "tests/test_agree.py::test_differing_gathers_exactly_when_the_reprs_differ"
ALONE = "tests/test_agree.py::test_alone_every_function_answers_with_this_process_value"
SNAPSHOT = "tests/test_rng_streams.py::test_a_snapshot_puts_back_every_generator"
SOME = "tests/test_rng_streams.py::test_a_snapshot_of_some_generators_leaves_the_others_running"
PINNED = "tests/test_rng_streams.py::test_derived_seeds_are_those_runs_were_resumed_with"
FEW = "tests/test_rng_streams.py::test_derived_seeds_for_a_few_runs"
RECOMPUTED = (
    "tests/test_recomputed_randomness.py::test_the_recomputation_draws_the_forwards_numbers_where_backward_needs_them"
)

MUTANTS = [
    # -- agreement (launch/agree.py) -----------------------------------------------------------------------------
    {
        "file": AGREE,
        "find": "hashlib.blake2b(repr(value).encode()",
        "replace": "hashlib.blake2b(repr(type(value)).encode()",
        "tests": [REPRS],
        "why": "the digest is over the wrong value (its type): ranks holding different values of one type pass as agreeing",
    },
    {
        "file": AGREE,
        "find": "bounds = torch.tensor([digest, -digest]",
        "replace": "bounds = torch.tensor([digest, digest]",
        "tests": [RANKS],
        "why": "the smallest digest is not negated: the bounds never match, and ranks that agree are told they differ",
    },
    {
        "file": AGREE,
        "find": "    if largest_ == -minus_smallest:\n        return None\n",
        "replace": "",
        "tests": [RANKS],
        "why": "the values are gathered (and reported as differing) even when every rank holds the same",
    },
    {
        "file": AGREE,
        "find": "    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)\n    return int(value.item())",
        "replace": "    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)\n    return int(value.item())",
        "tests": [RANKS],
        "why": "fewest takes the most updates: the rank with fewer batches runs out and the others hang in DDP",
    },
    {
        "file": AGREE,
        "find": "    dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=group)",
        "replace": "    dist.all_reduce(reduced, op=dist.ReduceOp.SUM, group=group)",
        "tests": [RANKS],
        "why": "Context.agree sums the ranks' values: a micro-batch size adopted by all is the sum of theirs",
    },
    {
        "file": AGREE,
        "find": "    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)\n    return bool(value.item())",
        "replace": "    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)\n    return bool(value.item())",
        "tests": [RANKS],
        "why": "all_true holds when one rank's flag does: a checkpoint saved when one rank could not write its part",
    },
    {
        "file": AGREE,
        "find": "    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)\n    return bool(value.item())",
        "replace": "    dist.all_reduce(value, op=dist.ReduceOp.MIN, group=group)\n    return bool(value.item())",
        "tests": [RANKS],
        "why": "any_true needs every rank's flag: a pre-empted rank stops alone, the others wait for it",
    },
    {
        "file": AGREE,
        "find": "    return box[0]\n",
        "replace": "    return value\n",
        "tests": [RANKS],
        "why": "from_rank0 returns each rank's own value: the ranks decide on what they each see",
    },
    {
        "file": AGREE,
        "find": "    dist.all_gather_object(values, value, group=group)\n",
        "replace": "    values[dist.get_rank(group)] = value\n",
        "tests": [RANKS],
        "why": "gathered fills in this rank's value only: the others' are None",
    },
    {
        "file": AGREE,
        "find": "    if not (dist.is_available() and dist.is_initialized()):\n        return 1\n",
        "replace": "",
        "tests": [ALONE],
        "why": "a single process without a process group asks torch.distributed for its world size, and fails",
    },
    # -- the snapshot (core.rng.Generators) --------------------------------------------------------------------
    {
        "file": RNG,
        "find": 'numpy = sys.modules.get("numpy") if "numpy" in kinds else None',
        "replace": "numpy = None",
        "tests": [SNAPSHOT],
        "why": "the snapshot forgets NumPy: a failed attempt's or a recomputation's NumPy draws are not given back",
    },
    {
        "file": RNG,
        "find": 'self.rng = torch.get_rng_state() if "torch" in kinds else None',
        "replace": 'self.rng = torch.get_rng_state() if "torch" in EVERY else None',
        "tests": [SOME],
        "why": "a snapshot of Python's and NumPy's generators puts torch's back too (activation checkpointing's "
        "replay would undo the draws torch made meanwhile)",
    },
    {
        "file": RNG,
        "find": "        self.py_rng = random.getstate() if",
        "replace": "        self.py_rng = random.Random().getstate() if",
        "tests": [SNAPSHOT],
        "why": "the snapshot takes a fresh generator's state, not the global one's",
    },
    {
        "file": "src/composetrain/transforms/_recompute.py",
        "find": "        self.start = Generators(HOST)\n",
        "replace": '        self.start = Generators(("python",))\n',
        "tests": [RECOMPUTED],
        "why": "the replay's snapshot forgets NumPy (its stream still put back after): the recomputation draws other "
        "numbers than the forward, and backward computes with them",
    },
    # -- the derived seeds (core.rng.derive_seed) --------------------------------------------------------------
    {
        "file": RNG,
        "find": "        return seed * 1000003 + rank\n",
        "replace": "        return seed + rank\n",
        "tests": [PINNED],
        "why": "a fresh start's seed changed: rank 1 of seed 0 draws as rank 0 of seed 1, and a checkpoint's streams differ",
    },
    {
        "file": RNG,
        "find": "        return seed * 7919 + rank\n",
        "replace": "        return seed * 7919 + rank * 104729\n",
        "tests": [PINNED],
        "why": "the loader's generator seeded as the workers are: a resumed run's loader seeds its workers differently",
    },
    {
        "file": RNG,
        "find": "        return (seed * 7919 + rank * 104729 + 1009 * worker) % 2**32\n",
        "replace": "        return seed * 7919 + rank * 104729 + 1009 * worker\n",
        "tests": [FEW],
        "why": "a worker's seed not wrapped below 2**32: a large seed's workers draw otherwise than in the runs before",
    },
]
