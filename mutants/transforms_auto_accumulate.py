"""The planted bugs of src/composetrain/transforms/_auto_accumulate.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": "            p.grad = grad.clone()\n",
        "replace": "            p.grad = grad\n",
        "tests": [
            "tests/test_auto_accumulate_undo.py::test_an_oom_in_a_later_micro_batch_restores_the_gradients_from_before_the_call",
        ],
        "why": "20.5: a retry gets the saved gradients themselves, which the next attempt's backward adds into",
        "from": "issue20",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": "self.grads = [(p, p.grad.clone()) for p in params if p.grad is not None]",
        "replace": "self.grads = [(p, p.grad) for p in params if p.grad is not None]",
        "tests": [
            "tests/test_auto_accumulate_undo.py::test_an_oom_in_the_first_attempt_after_a_backward_restores_the_gradients_from_before_the_call",
        ],
        "why": (
            "20.5: the gradients from before the call kept as aliases, which the first attempt's backward adds into"
        ),
        "from": "issue20",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": "torch._foreach_copy_(self.buffers, self.values)",
        "replace": "pass",
        "tests": [
            "tests/test_auto_accumulate_undo.py::test_python_numpy_torch_streams_and_every_buffer_are_those_of_accumulate_n",
        ],
        "why": "buffers a failed attempt changed in place keep its values",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": "self.tables = [(m, dict(m._buffers)) for m in model.modules()]",
        "replace": "self.tables = [(m, dict(m._buffers)) for m in model.modules() if m._buffers]",
        "tests": [
            "tests/test_auto_undo_completeness.py::test_a_buffer_registered_by_a_failed_attempt_is_removed",
        ],
        "why": "a buffer a failed attempt registered on a module that had none stays",
        "from": "issue19",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": (
            "                    memory.found, memory.micro_batch = memory.micro_batch, before  # kept by the "
            "update phase\n"
        ),
        "replace": "                    memory.found = memory.micro_batch\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": (
            "the size found by the passes is kept at once: a call refused after them still shrinks the "
            "checkpointed micro-batch"
        ),
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/transforms/_auto_accumulate.py",
        "find": (
            "        memory.micro_batch = memory.found  # every refusal is behind: the size the passes found is kept\n"
        ),
        "replace": "",
        "tests": [
            "tests/test_refusals_change_nothing.py",
            "tests/test_auto_accumulate.py",
        ],
        "why": "the size found is never kept: every update runs out of memory again before it fits",
        "from": "issue29_x_atomic",
    },
]
