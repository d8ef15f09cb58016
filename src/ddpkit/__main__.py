"""``python -m ddpkit`` is the ``ddpkit`` command."""

import sys

from ddpkit.cli import main

sys.exit(main())
