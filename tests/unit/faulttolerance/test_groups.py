"""ReplicaGroups' refusals, before any torchft call (the extra to install, the group and the
lighthouse it needs, its options, what the loop may be given), and its manager's parts on
torchft's real Manager and transport."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any
from unittest.mock import patch

import pytest
import torch

import ddpkit
from ddpkit.errors import ConfigError
from ddpkit.faulttolerance.groups import ReplicaGroups
from ddpkit.faulttolerance.manager import GroupManager


class World:
    rank, world_size, device = 0, 1, torch.device("cpu")


class Run:
    """The run a healing peer would receive (ddpkit's RunState, reduced)."""

    step = 0

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def started(groups: ReplicaGroups) -> GroupManager:
    """What the loop's start makes of the groups: torchft's manager of this group."""
    with patch("ddpkit.runtime.session.current_world", World):
        groups.attach(Run(), torch.nn.Linear(1, 1))
    return groups.manager


@pytest.fixture(autouse=True)
def rust_log(monkeypatch) -> None:
    """torchft's log level, which ddpkit sets before importing it, restored after the test."""
    monkeypatch.setenv("RUST_LOG", "warn")


def test_without_torchft_the_error_names_the_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torchft", None)  # import now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'ddpkit\[ft\]'"):
        started(ReplicaGroups(group="0", lighthouse="http://h:1"))


def test_the_group_and_the_lighthouse_are_asked_for(monkeypatch) -> None:
    monkeypatch.delenv("DDPKIT_FT_GROUP", raising=False)
    monkeypatch.delenv("TORCHFT_LIGHTHOUSE", raising=False)
    with pytest.raises(ConfigError, match="DDPKIT_FT_GROUP=0"):
        ReplicaGroups().name()
    with pytest.raises(ConfigError, match="a replica group is a number"):
        ReplicaGroups(group="east").name()
    with pytest.raises(ConfigError, match="TORCHFT_LIGHTHOUSE"):
        ReplicaGroups(group="0").address()
    monkeypatch.setenv("DDPKIT_FT_GROUP", "2")
    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", "http://h:1")
    assert (ReplicaGroups().name(), ReplicaGroups().address()) == ("2", "http://h:1")


def test_the_options_are_checked_named_and_shown_where_they_differ() -> None:
    with pytest.raises(ConfigError, match=r"timeout takes a number > 0 \(seconds\)"):
        ReplicaGroups(timeout=0)
    with pytest.raises(ConfigError, match=r"min_groups takes an integer >= 1"):
        ReplicaGroups(min_groups=0)
    with pytest.raises(ConfigError, match="ReplicaGroups takes its options by name"):
        ReplicaGroups("0")  # type: ignore[misc]
    with pytest.raises(ConfigError, match="ReplicaGroups has no option 'find_unused_parameters'"):
        ReplicaGroups(find_unused_parameters=True)  # type: ignore[call-arg]
    assert repr(ReplicaGroups(group="1", bucket_cap_mb=50.0)) == (
        "ReplicaGroups(group='1', bucket_cap_mb=50.0)")  # fmt: skip


def test_the_groups_say_how_to_start_them_when_used_before_the_loop() -> None:
    with pytest.raises(ConfigError, match=r"Trainer\(\.\.\., replica_groups=groups\)"):
        _ = ReplicaGroups(group="0").manager


@pytest.mark.timeout(60)
def test_an_unreachable_lighthouse_is_named_with_its_address(monkeypatch) -> None:
    pytest.importorskip("torchft")
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # the group's store, as ddpkit run sets it
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    groups = ReplicaGroups(group="0", lighthouse="http://127.0.0.1:1", timeout=2)
    said = r"could not reach the lighthouse at http://127.0.0.1:1 within 2 s"
    with pytest.raises(ConfigError, match=said):
        started(groups)


class Averaging:
    """torchft's AVG all-reduce over two groups, the other group's tensor given."""

    def __init__(self, other: torch.Tensor) -> None:
        self.other = other

    def current_step(self) -> int:
        return 0

    def participating_rank(self) -> int:
        return 0

    def allreduce(self, tensor: torch.Tensor) -> object:
        tensor.add_(self.other).div_(2)
        return type("Done", (), {"wait": lambda self: True})()


def start_checked(mine: torch.nn.Module, theirs: torch.nn.Module) -> None:
    groups = object.__new__(GroupManager)
    sums = torch.stack([p.detach().double().sum() for p in theirs.parameters()])
    groups.manager, groups.group = Averaging(torch.cat([sums, sums * sums])), "0"
    groups._check_same_start(mine)


def test_groups_that_start_from_other_weights_are_refused_at_the_first_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    start_checked(model, model)  # seeded alike: nothing to say
    torch.manual_seed(1)
    with pytest.raises(ConfigError, match=r"start from different weights.*seed every group alike"):
        start_checked(model, torch.nn.Linear(4, 2))


def test_what_one_group_cannot_do_alone_is_refused_before_training() -> None:
    """Skipping a NaN step (the other groups would take it), and something else given as
    the groups."""
    model = torch.nn.Linear(1, 1)
    ddpkit.init()
    try:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(ConfigError, match="nonfinite_loss='skip' is not supported"):
            ddpkit.TrainLoop({"model": model, "optimizer": optimizer}, nonfinite_loss="skip",
                             replica_groups=ReplicaGroups(group="0"))  # fmt: skip
        with pytest.raises(ConfigError, match=r"replica_groups takes a ddpkit.ReplicaGroups"):
            ddpkit.TrainLoop({"model": model, "optimizer": optimizer},
                             replica_groups="0")  # type: ignore[typeddict-item]  # fmt: skip
    finally:
        ddpkit.shutdown()


class Payload:
    """An object a peer must not be able to make a healing group unpickle."""


def served(state: object) -> object:
    """What ``urlopen`` gives for a peer's checkpoint server streaming ``state``."""
    import io

    from torch.distributed._serialization import _streaming_save

    stream = io.BytesIO()
    _streaming_save(state, stream)
    stream.seek(0)
    return contextlib.nullcontext(stream)


def test_a_peers_state_is_loaded_weights_only_into_tensors_of_its_own(monkeypatch) -> None:
    pytest.importorskip("torchft")
    import pickle
    from datetime import timedelta

    from ddpkit.faulttolerance.heal import HealTransport

    def load(state: object) -> object:
        monkeypatch.setattr("urllib.request.urlopen", lambda address, timeout: served(state))
        return HealTransport._load_from_address("http://peer:1/full", timedelta(seconds=5))

    state = load({"w": torch.ones(3), "opt": [torch.zeros(2), 7]})
    # An optimizer steps its state in place: memory of its own, not the received bytes'.
    assert all(t.untyped_storage().resizable() for t in (state["w"], state["opt"][0]))
    assert state["w"].tolist() == [1.0, 1.0, 1.0] and state["opt"][1] == 7
    with pytest.raises(pickle.UnpicklingError, match=r"Unsupported global.*Payload"):
        load({"w": torch.ones(1), "payload": Payload()})


@pytest.fixture
def real_lighthouse() -> Any:
    """torchft's own lighthouse, in this process (cheap: no fake needed)."""
    pytest.importorskip("torchft")
    from ddpkit.faulttolerance.heal import serve_lighthouse

    server = serve_lighthouse("127.0.0.1:0", min_groups=1, heartbeat_timeout=0.5, join_timeout=0.1)
    yield server
    server.shutdown()


def groups_at(lighthouse: str, monkeypatch: pytest.MonkeyPatch, **options: Any) -> GroupManager:
    """A replica group of one process on torchft's real Manager, its store on loopback."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # the group's store, as ddpkit run sets it
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    groups = started(ReplicaGroups(group="0", lighthouse=lighthouse, **options))
    groups._store_kept = store  # type: ignore[attr-defined]  # alive as long as the group
    return groups


@pytest.mark.timeout(60)
def test_quorum_numbers_are_renumbered_on_torchfts_real_manager(
    real_lighthouse: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renumbering sits on torchft's own quorum path: the number torchft's manager keys
    its process group's store prefix by is ddpkit's, not the lighthouse's."""
    from ddpkit.faulttolerance.quorum import QuorumNumbers

    given: list[tuple[int, int]] = []  # (the lighthouse's number, ddpkit's)
    renumber = QuorumNumbers.renumber

    def noted(self: QuorumNumbers, number: int, members: list[str], step: int) -> int:
        given.append((number, renumber(self, number, members, step)))
        return given[-1][1]

    monkeypatch.setattr(QuorumNumbers, "renumber", noted)
    groups = groups_at(real_lighthouse.address(), monkeypatch, timeout=10)
    try:
        groups.start()
        assert groups.position() == 0
        [(lighthouses, ours)] = given
        assert groups.manager._quorum_id == ours != lighthouses
    finally:
        groups.manager.shutdown(wait=False)


@pytest.mark.timeout(60)
def test_a_healing_peers_state_is_loaded_weights_only_on_torchfts_receive_path(
    tmp_path: Any,
) -> None:
    """torchft's HTTP transport, both ends real: plain tensors arrive, while a state holding
    an object whose unpickling would run code is refused (torchft's own loader would run it:
    it loads with weights_only=False)."""
    pytest.importorskip("torchft")
    from datetime import timedelta

    from ddpkit.faulttolerance.heal import HealTransport

    timeout = timedelta(seconds=10)
    sender, receiver = HealTransport(timeout), HealTransport(timeout)
    try:
        sender.send_checkpoint([0], 3, {"w": torch.arange(4.0), "step": 3}, timeout)
        got = receiver.recv_checkpoint(0, sender.metadata(), 3, timeout)
        assert torch.equal(got["w"], torch.arange(4.0)) and got["step"] == 3
        marker = tmp_path / "ran"
        sender.disallow_checkpoint()
        sender.send_checkpoint([0], 4, {"evil": _RunsCode(str(marker))}, timeout)
        with pytest.raises(Exception, match=r"[Ww]eights only load failed|Unsupported global"):
            receiver.recv_checkpoint(0, sender.metadata(), 4, timeout)
        assert not marker.exists()
    finally:
        sender.shutdown(wait=False)
        receiver.shutdown(wait=False)


class _RunsCode:
    """An object whose unpickling writes a file: what a hostile peer would send."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (_write, (self.path, "ran"))


def _write(path: str, text: str) -> None:
    with open(path, "w") as out:
        out.write(text)


@pytest.mark.timeout(60)
def test_torchfts_manager_is_shut_down_with_the_run(
    real_lighthouse: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shutting torchft's manager down is registered for the process's end (a function
    worker ends by os._exit after the exit handlers, never by the interpreter's teardown,
    which would drop it): run, it stops the manager's server, whose port then refuses."""
    from urllib.parse import urlsplit

    groups = groups_at(real_lighthouse.address(), monkeypatch, timeout=10)
    where = urlsplit(groups.manager._manager.address())
    assert _serving(where.port)
    assert groups.close.alive and groups.close.atexit  # at the process's end at the latest
    groups.close()  # what the exit handlers run
    deadline = time.monotonic() + 10  # torchft stops its server in the background
    while _serving(where.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _serving(where.port)
    assert not groups.close.alive  # once only


def _serving(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), 2).close()
    except OSError:
        return False
    return True
