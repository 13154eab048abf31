"""The lowest layer: what a training step is (``protocol``), how steps compose (``steps``) and which cannot wrap
which (``composition_rules``), the state they train (``state``), how batches split (``batching``), random states
(``rng``) and small shared checks (``util``). It imports nothing else of composetrain."""
