"""``ddpkit lighthouse``: the torchft lighthouse a fault-tolerant job's replica groups meet at
(experimental)."""
