"""Shared test helpers: launching the CLI, worker functions, the test SLURM cluster."""
