"""Tests under real cluster managers: a one-node SLURM cluster and mpirun."""
