"""Data layer: ``ct.cache``, ``ct.hdf5`` and the memory-mapped dataset they return."""
