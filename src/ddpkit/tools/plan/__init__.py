"""``ddpkit plan``: one rank of a world the machine does not have, over torch's fake process
group: its memory, one step's collectives and their ring-bound time."""
