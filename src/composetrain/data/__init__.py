"""Data layer: ``ct.cache`` and the memory-mapped dataset it returns."""
