"""``ddpkit verify``: N workers against one process, step by step."""
