"""Warm workers unless asked otherwise: how ``ddpkit run`` starts its workers.

By default every worker is a fork of the launch's warm server, which imported torch once
(``--run-path --start-method forkserver``): a launch and each restart skip the workers'
imports. A fresh ``python`` per worker, torchrun's default, is kept where it is asked for or
where a fork cannot stand in for one:

- ``--fresh-workers``: a fresh interpreter per worker (with ``--run-path``, one spawned from
  a function, as torchrun's ``--run-path`` does);
- ``--start-method spawn`` or ``fork`` (or ``PET_START_METHOD``): torchrun's meaning, whole
  (with ``--run-path`` function workers started that way, else a ``python`` each);
- ``--no-python``: the workers run an executable, not Python.

A fork that cannot be made where the launch runs (the server's socket path too long for a
long ``TMPDIR``) starts the workers by spawn and says so (:mod:`.forkserver`).

Example:
    >>> import argparse
    >>> args = argparse.Namespace(start_method=None, run_path=False, fresh_workers=False,
    ...                           no_python=False)
    >>> choose_workers(args); args.start_method, args.run_path
    ('forkserver', True)
"""

from __future__ import annotations

import argparse

from ddpkit.errors import ConfigError

WARM = "forkserver"


def choose_workers(args: argparse.Namespace) -> None:
    """Set ``args.start_method`` and ``args.run_path`` from what the command line asked for:
    warm workers unless a fresh interpreter is asked for or needed (the module's list).

    Example:
        >>> import argparse
        >>> args = argparse.Namespace(start_method=None, run_path=False, fresh_workers=True,
        ...                           no_python=False)
        >>> choose_workers(args); args.start_method, args.run_path
        ('spawn', False)
    """
    fresh = bool(getattr(args, "fresh_workers", False))
    if fresh and args.start_method == WARM:
        raise ConfigError(
            "--fresh-workers asks for a fresh python per worker and --start-method forkserver "
            "for forks of a warm server: pass one of them"
        )
    if args.start_method is None:  # neither --start-method nor PET_START_METHOD
        args.start_method = "spawn" if fresh or args.no_python else WARM
    if args.start_method == WARM and not args.no_python:
        args.run_path = True


def warm(args: argparse.Namespace) -> bool:
    """Whether the workers are forks of a warm server (after :func:`choose_workers`).

    Example:
        >>> import argparse
        >>> warm(argparse.Namespace(run_path=True, start_method="forkserver"))
        True
    """
    return bool(args.run_path) and args.start_method == WARM
