"""Planted bugs in the core transforms and batching (see tools/mutants.py)."""

MUTANTS = [
    {
        "file": "src/composetrain/core/batching.py",
        "find": "[size // k + (i < size % k) for i in range(k)]",
        "replace": "[size // k + (i <= size % k) for i in range(k)]",
        "tests": ["tests/test_batching.py"],
        "why": "uneven split: the pieces' sizes off by one",
    },
    {
        "file": "src/composetrain/transforms/accumulate.py",
        "find": "last_backward=ctx.last_backward and i == last",
        "replace": "last_backward=ctx.last_backward",
        "tests": ["tests/test_accumulate.py", "tests/test_distributed.py"],
        "why": "every micro-batch's backward syncs gradients (no no_sync)",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": "if p.grad is not None]",
        "replace": "if p.grad is not None][:-1]",
        "tests": ["tests/test_clip.py"],
        "why": "the clipping norm leaves out one parameter",
    },
    {
        "file": "src/composetrain/transforms/clip.py",
        "find": 'return Update(applied.skipped, {**applied.metrics, "grad_norm": norm})',
        "replace": 'return Update(False, {**applied.metrics, "grad_norm": norm})',
        "tests": ["tests/test_clip.py", "tests/test_precision.py"],
        "why": "a skipped update is reported as applied",
    },
]
