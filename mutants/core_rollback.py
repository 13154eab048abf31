"""The planted bugs of src/composetrain/core/_rollback.py, replayed by tools/mutants.py.

Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or
write a catalogue of your own and run it.
"""

MUTANTS = [
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": ("            module._buffers.clear()\n            module._buffers.update(table)\n"),
        "replace": "            pass\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: buffer values put back but not the tables: a buffer the forward re-registered or added stays",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": ("        for p, g in self.grads:\n            p.grad = g\n"),
        "replace": "",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: gradients set before a refused call are lost",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": "self.grads = [(p, p.grad.clone()) for p in params if p.grad is not None]",
        "replace": "self.grads = [(p, p.grad) for p in params if p.grad is not None]",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "29.8: the earlier gradients kept by reference: backward adds the refused call's into them",
        "from": "issue29_atomic",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": (
            "            for weight, rows, values in reversed(self.rows):  # the first forward's rows last: as "
            "before the call\n"
        ),
        "replace": "            for weight, rows, values in self.rows:\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "rows looked up by two micro-batches are put back as the second found them, already renormalised",
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": '        indices = args[0] if args else kwargs.get("input")\n',
        "replace": "        indices = args[0] if args else None\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "an embedding called with input= is not seen: the rows it renormalised stay changed after a refusal",
        "from": "issue29_x_atomic",
    },
    {
        "file": "src/composetrain/core/_rollback.py",
        "find": "            if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.max_norm is not None:\n",
        "replace": "            if isinstance(m, nn.Embedding) and m.max_norm is not None:\n",
        "tests": [
            "tests/test_refusals_change_nothing.py",
        ],
        "why": "EmbeddingBag(max_norm=...) forgotten: its renormalised rows stay changed after a refusal",
        "from": "issue29_x_atomic",
    },
]
