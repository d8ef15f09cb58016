"""Warm workers: a server that imported torch once forks each worker, so a restart or a
notebook's ``ddpkit.spawn`` does not pay for the import again.

- :mod:`~ddpkit.launch.warm.choice`: warm workers by default, and when a fresh ``python``
  per worker is kept instead.
- :mod:`~ddpkit.launch.warm.forkserver`: the server, its preloads and the start method.
- :mod:`~ddpkit.launch.warm.serverready`: the server's last preload (its imports frozen for
  the forks to share).
- :mod:`~ddpkit.launch.warm.interactive`: ``ddpkit.spawn`` of a function typed in a notebook
  or a REPL.
"""
