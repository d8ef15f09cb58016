"""Shared fixtures: every test starts and ends with no process group and a clean environment."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest
import torch.distributed as dist

import ddpkit
from ddpkit.tools.doctor.envinfo import (
    LAUNCHER_VARS,  # torchrun's contract: must not leak into a test
)

# Scripts run under `ddpkit run` only; importing them (doctest collection) would start them.
collect_ignore = ["scripts"]


# pytest and torch's compiler caches set these themselves; they are not ours to police.
_OWNED_ELSEWHERE = ("PYTEST_", "TORCHINDUCTOR_", "TRITON_")

# Variables third-party libraries set of their own when first imported, or later from a
# thread of theirs: whichever test imports one first must not be blamed (the unit tier runs
# in any order: --random-order). Exact names, so the check stays strict for everything else.
_SET_BY_LIBRARIES = {
    "KMP_DUPLICATE_LIB_OK": "scikit-learn, joblib (at import)",
    "KMP_INIT_AT_FORK": "scikit-learn, joblib (at import)",
    "_MLFLOW_TELEMETRY_SESSION_ID": "mlflow 3 (at import; unset when telemetry is off)",
    # ddpkit.init() arms torch's Flight Recorder and NCCL's error handling before the first
    # process group, for the process's life (torch reads them then): flightrecorder/arming.py
    "TORCH_FR_BUFFER_SIZE": "ddpkit.init() (the Flight Recorder)",
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "ddpkit.init() on torch 2.7 (the Flight Recorder)",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "ddpkit.init() (NCCL's errors surface)",
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "ddpkit.init() (NCCL dumps the recorder on a timeout)",
    "TORCH_FR_DUMP_TEMP_FILE": "ddpkit.init() under an elastic launch (where dumps go)",
    # kineto reads it when a process first profiles: observe/profiling/profiler.py quiets it
    "KINETO_LOG_LEVEL": "a profiled window (kineto's start/stop notices)",
}
# mlflow's telemetry would reach for the network from a thread; the tests have none.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# `make test` started in the background (`nohup make test &`) inherits SIGHUP, SIGINT and
# SIGQUIT ignored, and every process the tests start would too: a worker's Ctrl-C raises
# nothing, a child stops on no SIGHUP (ddpkit keeps an inherited SIG_IGN, as a fresh
# interpreter does). The tests are of ddpkit, not of how they were started: defaults back.
for _name in ("SIGHUP", "SIGQUIT"):
    if signal.getsignal(getattr(signal, _name)) == signal.SIG_IGN:
        signal.signal(getattr(signal, _name), signal.SIG_DFL)
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="session")
def sweep_killed_launchers() -> Iterator[None]:
    """At the end, the scratch folders of the launchers tests killed with -9 are removed, as
    a user's next launch removes them (a running launcher's folder is locked: kept)."""
    yield
    from ddpkit.launch.scratch import sweep_dead_launchers

    sweep_dead_launchers()


@pytest.fixture(autouse=True)
def clean_distributed_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher variables leak in; no process group or ddpkit world leaks out."""
    before = dict(os.environ)
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    leftover_group = dist.is_initialized()
    ddpkit.shutdown()
    monkeypatch.undo()  # what a test set through monkeypatch is not a leak
    leaked = _changed_variables(before)
    for name in leaked:
        if name in before:
            os.environ[name] = before[name]
        else:
            del os.environ[name]
    assert not leftover_group, "the test left a process group behind"
    assert not leaked, f"the test leaked environment variables: {leaked}"


def _changed_variables(before: dict[str, str]) -> list[str]:
    names = {n for n in set(before) | set(os.environ) if not n.startswith(_OWNED_ELSEWHERE)}
    names -= set(_SET_BY_LIBRARIES)
    return sorted(name for name in names if before.get(name) != os.environ.get(name))


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch):
    """Set torchrun's variables for one test: torchrun_env(rank=1, world_size=2, ...)."""

    def apply(**values: object) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name.upper(), str(value))

    return apply
