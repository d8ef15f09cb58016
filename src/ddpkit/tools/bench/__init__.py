"""``ddpkit bench``: the scaling table and charts at 1, 2, 4 workers."""
