"""Finding the job's processes: ``rendezvous`` (one process group, however the job was started), SLURM host
lists (``hostlist``) and elastic attempts (``attempts``). Above ``core`` only."""
