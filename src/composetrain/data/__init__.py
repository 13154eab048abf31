"""Datasets that ct.run reads a whole batch at a time: stores written once and memory-mapped."""
