"""One adapter per client library: each records a Timeline per attempt, nothing else."""
