"""The run: from a validated spec to a finished run (the kinds of run, the one round loop, its callbacks,
checkpoints, faults and what rank 0 shows)."""
