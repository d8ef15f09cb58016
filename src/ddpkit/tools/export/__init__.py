"""``ddpkit export``: a checkpoint's model weights as one plain file."""
