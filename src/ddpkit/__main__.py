"""``python -m ddpkit`` is the ``ddpkit`` command."""

from ddpkit.cli import run

run()
