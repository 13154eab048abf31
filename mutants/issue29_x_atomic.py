# ruff: noqa: E501
"""Planted bugs for the adversary's findings on issue 29 item 8 (a failed call changes nothing), each caught by the
tests named."""

HARNESS = "tests/test_refusals_change_nothing.py"
DISTRIBUTED = "tests/test_distributed.py::test_a_refusal_on_one_rank_is_a_refusal_on_every_rank"

MUTANTS = [
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "        if ctx.agree is not None and ctx.agree([0.0])[0]:\n",
        "replace": "        if False:\n",
        "tests": [DISTRIBUTED],
        "why": "a refusal on one rank is not learnt by the others: they apply the update, and the models part silently",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "            if ctx.agree is not None:\n                ctx.agree([1.0])  # the others refuse with this one\n",
        "replace": "            pass\n",
        "tests": [DISTRIBUTED],
        "why": "the refusing rank does not tell the others: they wait for it in the agreement (a hang), or pair it with the next update's collective",
    },
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": "                return last.around(contextlib.nullcontext())\n",
        "replace": "                return contextlib.nullcontext()\n",
        "tests": [DISTRIBUTED],
        "why": "the last backward's all-reduce is never marked as passed: an error of accumulate's passes after it is kept from the other ranks",
    },
    {
        "file": "src/composetrain/transforms/distributed.py",
        "find": "                last.refuse_with(ctx.agree)\n",
        "replace": "                pass\n",
        "tests": [DISTRIBUTED],
        "why": "an error of the passes after the last all-reduce is not told: the other ranks apply the update",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "            for p in params:  # also of a parameter the model gained after the TrainState was built\n                p.grad = None\n",
        "replace": "",
        "tests": [HARNESS],
        "why": "a parameter added to the model after the TrainState, outside the optimizer, keeps and grows its gradient over calls",
    },
]
