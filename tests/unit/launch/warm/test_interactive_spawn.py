"""How ddpkit.spawn starts the workers of a function typed into a notebook (no processes)."""

from __future__ import annotations

import sys
import types

import pytest

from ddpkit import ConfigError
from ddpkit.launch.warm import interactive
from ddpkit.launch.warm.interactive import start_method_for


def typed_in_a_notebook() -> None: ...


typed_in_a_notebook.__module__ = "__main__"


def test_a_function_of_a_file_is_spawned_and_one_typed_in_is_forked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert start_method_for(print) == "forkserver"  # Linux: workers forked from a warm server
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # no __file__
    assert start_method_for(typed_in_a_notebook) == "fork"


def test_fork_after_cuda_is_initialized_is_refused_with_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    monkeypatch.setattr(interactive, "_cuda_initialized", lambda: True)
    with pytest.raises(ConfigError, match=r"Restart the kernel and call ddpkit\.spawn before"):
        start_method_for(typed_in_a_notebook)
