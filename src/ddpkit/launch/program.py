"""What each worker runs, and the checks made before any worker starts.

A script that cannot start would fail on every rank at once, N tracebacks deep; the launcher
finds what it can first (a missing file, a module that is not importable, a SyntaxError) and
says it once, with no worker started.

Example:
    >>> Program("train.py", ("--lr", "0.1")).describe()
    'train.py'
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path
from typing import Any

from ddpkit.errors import ConfigError, ScriptError


@dataclass(frozen=True)
class Program:
    """What each worker runs: a script, a module (``-m``) or any executable (``--no-python``);
    ``run_path``: in a process torch's launcher starts from a function (torchrun's
    ``--run-path``), not a ``python`` of its own.

    Example:
        >>> Program("pkg.train", ("--lr", "1"), module=True).describe()
        '-m pkg.train'
    """

    target: str
    args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False
    run_path: bool = False

    def describe(self) -> str:
        return f"-m {self.target}" if self.module else self.target

    def entrypoint(self) -> tuple[str | Callable[..., Any], tuple[str, ...]]:
        """What torch's agent starts: ddpkit's worker bootstrap around the script or module
        (a command, or with ``run_path`` a function), or the executable itself (which runs
        without ddpkit's lifeline)."""
        if self.no_python:
            return self.target, self.args
        if self.run_path:
            from ddpkit.launch.worker import RunPath  # the bootstrap, run in the workers

            return RunPath(self.module), (self.target, *self.args)
        what = ("-m", self.target) if self.module else (self.target,)
        return sys.executable, ("-u", "-m", "ddpkit.launch.worker", *what, *self.args)

    def check(self) -> None:
        """What can be known before any worker starts: the script or module is there and
        compiles, the executable is on PATH. Raises ConfigError or ScriptError.

        Example:
            >>> Program("no/such/train.py").check()
            Traceback (most recent call last):
            ...
            ddpkit.errors.ConfigError: script no/such/train.py does not exist (looked in ...)
        """
        if self.no_python:
            if shutil.which(self.target) is None:
                raise ConfigError(f"--no-python: {self.target} is not an executable on PATH")
            return
        source = check_module(self.target) if self.module else check_script(self.target)
        if source is not None:
            check_compiles(source)


def check_script(script: str) -> Path:
    """The script's path, or a ConfigError naming what is wrong with it.

    Example:
        >>> check_script("no/such/train.py")
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: script no/such/train.py does not exist (looked in ...)
    """
    path = Path(script)
    if not path.exists():
        raise ConfigError(f"script {script} does not exist (looked in {Path.cwd()})")
    if not path.is_file():
        raise ConfigError(
            f"script {script} is a {'directory' if path.is_dir() else 'special file'}"
        )
    return path


def check_module(name: str) -> Path | None:
    """The module's source file (None when it has none), or a ConfigError unless
    ``python -m name`` would find it (from this folder too).

    Example:
        >>> check_module("no_such_module_here")
        Traceback (most recent call last):
        ...
        ddpkit.errors.ConfigError: module no_such_module_here (-m) is not importable from ...
    """
    sys.path.insert(0, os.getcwd())  # as `python -m` puts the current folder first
    try:
        spec = _spec_on_path(name) or importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path.pop(0)
    if spec is None:
        raise ConfigError(
            f"module {name} (-m) is not importable from {os.getcwd()}: check its name, or run "
            "from the folder that holds its package"
        )
    if spec.submodule_search_locations:  # a package runs its __main__
        main = Path(next(iter(spec.submodule_search_locations))) / "__main__.py"
        return main if main.is_file() else None
    origin = spec.origin
    return Path(origin) if origin and origin.endswith(".py") else None


def _spec_on_path(name: str) -> ModuleSpec | None:
    """``name``'s spec from sys.path, part by part, without running any package's
    ``__init__`` in the launcher (``find_spec`` would); None where another finder (an
    editable install's) is needed."""
    spec, path = None, None
    for part in name.split("."):
        if spec is not None and path is None:
            return None  # a dotted name under a plain module
        spec = PathFinder.find_spec(part, path)
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec


def check_compiles(script: Path) -> None:
    """A ScriptError with Python's own message (file, line, caret) when ``script`` does not
    compile: every worker would fail the same way, so none is started.

    Example:
        >>> import tempfile
        >>> bad = Path(tempfile.mkdtemp()) / "bad.py"; _ = bad.write_text("x = = 1")
        >>> check_compiles(bad)
        Traceback (most recent call last):
        ...
        ddpkit.errors.ScriptError: .../bad.py cannot run, so no worker was started:
          File ".../bad.py", line 1
            x = = 1
                ^
        SyntaxError: invalid syntax
    """
    try:
        compile(script.read_bytes(), str(script), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as err:  # ValueError: a NUL byte in the source
        python_says = "".join(traceback.format_exception_only(err)).rstrip()
        raise ScriptError(
            f"{script} cannot run, so no worker was started:\n{python_says}"
        ) from None
