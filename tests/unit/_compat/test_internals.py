"""Each private internal ddpkit reaches for is where ddpkit looks, on the torch this runs
under (make test: 2.13 here, 2.7 in test-oldest; the GPU tier's image: its own), or missing
where that release is known to lack it, with the fallback said; a release outside the
checked ones is said once, with what ddpkit does if the internal changed there."""

from __future__ import annotations

import logging

import pytest
import torch

import ddpkit._compat as compat
from ddpkit._compat import CHECKED, Internal
from ddpkit._compat.c10d import flight_recorder_dumpers
from ddpkit._compat.checkpointing import recompute_wrapper
from ddpkit._compat.ddpbuckets import BUCKETS
from ddpkit._compat.foreach import FOREACH_COPY, copy_all
from ddpkit._compat.inductor import _codecache, compile_counts, default_cache_dir
from ddpkit._compat.python import caller_frame
from ddpkit._compat.serialization import STREAMING_LOAD
from ddpkit._compat.torchrun import torchrun_flags
from ddpkit._core.torchversion import torch_at_least


@pytest.fixture(autouse=True)
def said_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """What is said once a process, said again in each test."""
    monkeypatch.setattr(compat, "_said", set())


def test_the_compilers_internals_are_found() -> None:
    found, built, captured = compile_counts() or (-1, -1, -1)
    assert min(found, built, captured) >= 0
    assert "torchinductor" in default_cache_dir()
    # torch 2.7 kept no precompiled-header folder of its own: headers are not kept then
    assert (_codecache() is not None) == torch_at_least("2.8")


def test_the_flight_recorders_dumps_are_found() -> None:
    names = {dumper.__name__ for dumper in flight_recorder_dumpers()}
    if torch_at_least("2.8"):  # the shared recorder every backend other than NCCL's uses
        assert "_dump_fr_trace" in names
    if torch.cuda.is_available():
        assert "_dump_nccl_trace" in names


def test_the_other_torch_internals_are_found() -> None:
    from torch.distributed import _serialization

    assert callable(_serialization._streaming_load), STREAMING_LOAD.where
    assert type(recompute_wrapper(torch.nn.Linear(1, 1))).__name__ == "CheckpointWrapper"
    assert {"--nproc-per-node", "--nnodes", "--standalone"} <= set(torchrun_flags())
    assert callable(torch._foreach_copy_), FOREACH_COPY.where
    reducer = torch.distributed.Reducer
    assert callable(reducer._push_all_rebuilt_params) and callable(reducer._rebuild_buckets), (
        BUCKETS.where
    )


def test_copying_many_tensors_at_once_falls_back_to_one_call_each(monkeypatch, caplog) -> None:
    """Where torch lacks the one-call copy, each tensor is copied alone: said once."""
    monkeypatch.delattr(torch, "_foreach_copy_")
    into, sources = (
        [torch.zeros(2), torch.zeros(3, dtype=torch.int64)],
        [torch.ones(2), torch.arange(3)],
    )
    with caplog.at_level(logging.WARNING, logger="ddpkit"):
        copy_all(into, sources)
    assert into[0].tolist() == [1.0, 1.0] and into[1].tolist() == [0, 1, 2]
    assert "torch._foreach_copy_ is not in torch" in caplog.text


def test_the_interpreters_internals_are_found() -> None:
    import atexit
    import threading

    assert caller_frame(0).f_code.co_name == "test_the_interpreters_internals_are_found"
    # what exit_as_python_does runs (not run here: it would end this process's executors)
    assert callable(atexit._run_exitfuncs) and isinstance(threading._threading_atexits, list)


def test_torchfts_internals_are_found() -> None:
    pytest.importorskip("torchft")
    from ddpkit._compat.torchft import heal_transport_base

    assert heal_transport_base().__name__ == "HTTPTransport"


def test_a_release_not_checked_is_said_once_with_the_fallback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    internal = Internal("torch.some._internal", "torch", "ddpkit does the slow thing instead")
    monkeypatch.setitem(CHECKED, "torch", ((1, 0), (1, 1)))  # torch 2.x: not checked
    with caplog.at_level(logging.WARNING, logger="ddpkit"):
        internal.used()
        internal.used()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said
    assert said[0].startswith("ddpkit uses torch.some._internal, checked on torch 1.0 to 1.1")
    assert said[0].endswith("if it changed there, ddpkit does the slow thing instead"), said[0]


def test_a_missing_internal_is_said_with_its_fallback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from torch._inductor import codecache

    monkeypatch.delattr(codecache, "_HEADER_DIR", raising=False)
    with caplog.at_level(logging.WARNING, logger="ddpkit"):
        assert _codecache() is None
    assert "_HEADER_DIR and _precompile_header is not in torch" in caplog.text
    assert "a restart on a new node builds them again" in caplog.text
