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
        "find": "                return last.around(replica.wait_for_gradients())\n",
        "replace": "                return replica.wait_for_gradients()\n",
        "tests": [DISTRIBUTED],
        "why": "the last backward's all-reduce is never marked as passed: an error of accumulate's passes after it is kept from the other ranks",
    },
    {
        "file": "src/composetrain/transforms/_deferred_sync.py",
        "find": "            last.refuse_with(ctx.agree)\n",
        "replace": "            pass\n",
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
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": "        return [s for inner in scheduler._schedulers for s in _stepped_next(inner)]\n",
        "replace": "        return [scheduler]\n",
        "tests": [HARNESS],
        "why": "a OneCycleLR inside ChainedScheduler is not looked at: its error comes after optimizer.step()",
    },
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": "        return _stepped_next(scheduler._schedulers[i])\n",
        "replace": "        return [scheduler]\n",
        "tests": [HARNESS],
        "why": "a OneCycleLR inside SequentialLR is not looked at: its error comes after optimizer.step()",
    },
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": "        upcoming = scheduler.last_epoch + 1  # as SequentialLR.step counts\n",
        "replace": "        upcoming = scheduler.last_epoch\n",
        "tests": [HARNESS],
        "why": "SequentialLR's next scheduler chosen one step early: a cycle restarted at its milestone is judged by its old count, an update it has steps for refused",
    },
    {
        "file": "src/composetrain/core/_state_checks.py",
        "find": "        if i > 0 and scheduler._milestones[i - 1] == upcoming:  # restarted at its milestone, not stepped\n            return []\n",
        "replace": "",
        "tests": [HARNESS],
        "why": "a scheduler SequentialLR restarts at its milestone is judged as stepped: an update it has steps for is refused",
    },
    {
        "file": "src/composetrain/core/steps.py",
        "find": "            except BaseException as e:  # after optimizer.step(): the parameters moved, state.step did not\n                state.unusable = (",
        "replace": "            except BaseException as e:  # after optimizer.step(): the parameters moved, state.step did not\n                _ = (",
        "tests": [HARNESS],
        "why": "a scheduler that fails after optimizer.step() leaves a half-updated state that trains on silently",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": "                    memory.found, memory.micro_batch = memory.micro_batch, before  # kept by the update phase\n",
        "replace": "                    memory.found = memory.micro_batch\n",
        "tests": [HARNESS],
        "why": "the size found by the passes is kept at once: a call refused after them still shrinks the checkpointed micro-batch",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": "        memory.micro_batch = memory.found  # every refusal is behind: the size the passes found is kept\n",
        "replace": "",
        "tests": [HARNESS, "tests/test_auto_accumulate.py"],
        "why": "the size found is never kept: every update runs out of memory again before it fits",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": "            for weight, rows, values in reversed(self.rows):  # the first forward's rows last: as before the call\n",
        "replace": "            for weight, rows, values in self.rows:\n",
        "tests": [HARNESS],
        "why": "rows looked up by two micro-batches are put back as the second found them, already renormalised",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": '        indices = args[0] if args else kwargs.get("input")\n',
        "replace": "        indices = args[0] if args else None\n",
        "tests": [HARNESS],
        "why": "an embedding called with input= is not seen: the rows it renormalised stay changed after a refusal",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": "            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.max_norm is not None:\n",
        "replace": "            if isinstance(m, nn.Embedding) and m.max_norm is not None:\n",
        "tests": [HARNESS],
        "why": "EmbeddingBag(max_norm=...) forgotten: its renormalised rows stay changed after a refusal",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "            kept.close()\n",
        "replace": "",
        "tests": [HARNESS],
        "why": "the row-keeping hooks stay on the embedding after the call: they pile up, one more per update, and hold every update's rows",
    },
]
