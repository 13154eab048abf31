"""The transforms, one public module each beside its private helpers (``_x.py``, used only in this folder):
``accumulate``, ``precision``, ``clip``, ``clip_value``, ``agc``, ``data_parallel``, ``pipeline``, ``distributed``,
``sharded``, ``activation_checkpointing``, and the learning-rate rules. They import ``core`` and ``launch`` only."""
