"""``ddpkit doctor``: the environment report, preflight checks, smoke test, short run."""
