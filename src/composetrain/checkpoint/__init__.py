"""The one owner of ct.run's checkpoint format: its files and keys, atomic writing and the latest valid
checkpoint (``files``), the folder's names and lock (``folder``), sharded tensors through DCP (``shards``),
and ``load_checkpoint``. Above ``core``, ``launch`` and ``transforms``; the driver uses it."""
