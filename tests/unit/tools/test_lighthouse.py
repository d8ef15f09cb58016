"""``ddpkit lighthouse``'s refusals: the extra to install, a port in use, a bad count."""

from __future__ import annotations

import socket
import sys

import pytest

from ddpkit.cli import main


@pytest.fixture(autouse=True)
def rust_log(monkeypatch) -> None:
    """torchft's log level, which ddpkit sets before importing it, restored after the test."""
    monkeypatch.setenv("RUST_LOG", "warn")


def test_without_torchft_it_names_the_extra(monkeypatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "torchft", None)
    monkeypatch.setitem(sys.modules, "torchft.coordination", None)
    assert main(["lighthouse", "--bind", "127.0.0.1:0"]) == 2
    assert "pip install 'ddpkit[ft]'" in caplog.text


def test_a_port_in_use_is_named_with_the_fix(caplog) -> None:
    pytest.importorskip("torchft")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["lighthouse", "--bind", f"127.0.0.1:{port}"]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in caplog.text
    assert "give another --bind" in caplog.text


def test_a_count_below_one_is_refused(caplog) -> None:
    assert main(["lighthouse", "--min-groups", "0"]) == 2
    assert "--min-groups" in caplog.text
