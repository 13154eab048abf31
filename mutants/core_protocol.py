"""The planted bugs of src/composetrain/core/protocol.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "        check_inside(self._label(), self.refuses_inside, inside)",
        "replace": "        check_inside(self._label(), self.refuses_inside, {getattr(inner, 'role', None)})",
        "tests": [
            "tests/test_composition_rules.py::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step",
        ],
        "why": "31.4.8: only the step right inside is checked: data_parallel(ema(mixed_precision(step))) is built",
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "        check_inside(self._label(), self.refuses_inside, inside)",
        "replace": "        check_inside(self._label(), inner.refuses_inside if inner is not None else {}, inside)",
        "tests": [
            "tests/test_composition_rules.py::test_every_pair_is_refused_with_the_tables_reason_or_agrees_with_the_plain_step",
        ],
        "why": (
            "31.4.9: the rules read from the inner step's row, not the outer's: the refused orders are built and "
            "the right ones refused"
        ),
        "from": "composition_rules",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": (
            "            self._verified(state, done, ctx)  # the last refusal: from here on the call changes the "
            "state\n"
            "            undo = None\n"
        ),
        "replace": ("            undo = None\n            self._verified(state, done, ctx)\n"),
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": (
            "29.8: the undo is dropped before verify: a buffer ct.ema refuses stays changed, the generators advanced"
        ),
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": ("            self.verify(state, done, ctx)\n        except Exception:\n"),
        "replace": "        except Exception:\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: no verify phase: ct.ema's buffer check runs in its update, after optimizer.step()",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "            kept.keep_buffers(state.model)  # after prepare, which may place the model (once)\n",
        "replace": "",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: buffers not kept: BatchNorm's running statistics of a refused call stay",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "        if ctx.agree is not None and ctx.agree([0.0])[0]:\n",
        "replace": "        if False:\n",
        "tests": [
            "tests/test_distributed.py::test_a_refusal_on_one_rank_is_a_refusal_on_every_rank",
        ],
        "why": (
            "a refusal on one rank is not learnt by the others: they apply the update, and the models part silently"
        ),
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": (
            "            if ctx.agree is not None:\n"
            "                ctx.agree([1.0])  # the others refuse with this one\n"
        ),
        "replace": "            pass\n",
        "tests": [
            "tests/test_distributed.py::test_a_refusal_on_one_rank_is_a_refusal_on_every_rank",
        ],
        "why": (
            "the refusing rank does not tell the others: they wait for it in the agreement (a hang), or pair it "
            "with the next update's collective"
        ),
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": (
            "            for p in params:  # also of a parameter the model gained after the TrainState was built\n"
            "                p.grad = None\n"
        ),
        "replace": "",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": (
            "a parameter added to the model after the TrainState, outside the optimizer, keeps and grows its "
            "gradient over calls"
        ),
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/core/protocol.py",
        "find": "            kept.close()\n",
        "replace": "",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": (
            "the row-keeping hooks stay on the embedding after the call: they pile up, one more per update, and "
            "hold every update's rows"
        ),
        "from": "issue29_x_atomic",
    },
]
