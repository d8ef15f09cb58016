"""The first code of every worker ``ddpkit run`` starts: tie it to the launcher, run the script.

The worker first ties its life to the launcher's (:mod:`ddpkit.launch.lifeline`), then runs the
script as ``python script.py`` would: ``__main__``, ``sys.argv`` and ``sys.path[0]`` are the
script's, and a traceback starts at the script's own frames. The package does not import
this module, so ``python -m ddpkit.launch.worker`` runs it fresh.

    python -m ddpkit.launch.worker train.py --epochs 10      # what each worker runs
    python -m ddpkit.launch.worker -m pkg.train --epochs 10  # ddpkit run -m pkg.train

Example:
    >>> _script_frames(None, "train.py") is None
    True
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import runpy
import signal
import sys
from collections.abc import Mapping
from types import TracebackType

from ddpkit._core.protocol import WORKER_SETUP_ENV
from ddpkit.errors import ConfigError
from ddpkit.launch.lifeline import die_with_launcher


def main(argv: list[str] | None = None) -> None:
    """Run ``argv[0]`` as ``__main__`` with the rest as its arguments.

    Example::

        main(["train.py", "--epochs", "3"])
    """
    args = list(sys.argv[1:] if argv is None else argv)
    module = len(args) >= 2 and args[0] == "-m"
    if module:
        args = args[1:]
    if not args:
        sys.exit("usage: python -m ddpkit.launch.worker [-m MODULE | SCRIPT] [ARGS...]")
    die_with_launcher()
    run_setup()
    _run_as_main(args, module)


def _run_as_main(args: list[str], module: bool) -> None:
    """``python SCRIPT ARGS`` or ``python -m MODULE ARGS``, in this process."""
    sys.argv = list(args)
    if module:  # as `python -m`: the current folder first, argv[0] the module's file
        sys.path[0] = os.getcwd()
        spec = importlib.util.find_spec(args[0])
        script = spec.origin if spec is not None and spec.origin else args[0]
    else:
        script = args[0]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        if module:
            runpy.run_module(args[0], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
    except SystemExit:
        raise
    except KeyboardInterrupt:  # Ctrl-C reached the launcher, which says so once for all
        sys.exit(128 + signal.SIGINT)
    except BaseException as err:
        # As `python script.py` does, but without this module's and runpy's frames on top.
        sys.excepthook(type(err), err, _script_frames(err.__traceback__, script))
        sys.exit(1)


def run_setup(environ: Mapping[str, str] | None = None) -> None:
    """Call the ``module:function`` that ``DDPKIT_WORKER_SETUP`` names, before the script.

    ddpkit's commands use it to hook into the workers they start (``ddpkit verify``
    registers its recorder this way), so the library never imports the commands.

    Example:
        >>> run_setup({})  # nothing named: nothing to do
        >>> run_setup({WORKER_SETUP_ENV: "ddpkit.x"})
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: DDPKIT_WORKER_SETUP='ddpkit.x' is not MODULE:FUNCTION
    """
    spec = (os.environ if environ is None else environ).get(WORKER_SETUP_ENV)
    if not spec:
        return
    module, _, function = spec.partition(":")
    if not module or not function:
        raise ConfigError(f"{WORKER_SETUP_ENV}={spec!r} is not MODULE:FUNCTION")
    getattr(importlib.import_module(module), function)()


def _script_frames(tb: TracebackType | None, script: str) -> TracebackType | None:
    start = tb
    while start is not None and start.tb_frame.f_code.co_filename != script:
        start = start.tb_next
    return start or tb  # an error before the script's first line: keep everything


if __name__ == "__main__":
    main()
