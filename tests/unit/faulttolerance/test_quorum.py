"""torchft's quorum numbers renumbered so a restarted lighthouse's numbers never reuse an
earlier quorum's store prefix, and every member of a quorum gets the same number."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import pytest

from ddpkit.faulttolerance.quorum import QuorumNumbers, install


@dataclass
class Answer:
    """What torchft's client answers a quorum request with (the fields used here)."""

    quorum_id: int
    replica_ids: list[str]
    max_step: int
    heal: bool = False


@dataclass
class Client:
    answers: list[Answer]
    asked: list[dict[str, Any]] = field(default_factory=list)

    def _quorum(self, **request: Any) -> Answer:
        self.asked.append(request)
        return self.answers.pop(0)

    def should_commit(self) -> bool:
        return True


class Manager:
    """What torchft's manager holds of its client (torchft 0.2's ``_client``)."""

    def __init__(self, client: Client) -> None:
        self._client: Any = client


def numbers_seen(answers: list[Answer]) -> list[int]:
    manager = Manager(Client(answers))
    assert install(manager)
    return [manager._client._quorum(step=0).quorum_id for _ in range(len(answers))]


def test_a_lighthouse_restarted_mid_run_never_gives_an_earlier_quorums_number_again() -> None:
    a, b = "ddpkit_group_0:a", "ddpkit_group_1:b"
    survivor = numbers_seen([
        Answer(1, [a], 0), Answer(2, [a, b], 2), Answer(2, [a, b], 3),  # the first lighthouse
        Answer(1, [a, b], 6), Answer(1, [a, b], 7), Answer(2, [a], 9),  # the restarted one
    ])  # fmt: skip
    assert survivor[1] == survivor[2] and survivor[3] == survivor[4]  # a quorum keeps its number
    assert len({survivor[0], survivor[1], survivor[3], survivor[5]}) == 4


def test_every_member_of_a_quorum_gets_the_same_number_however_it_came() -> None:
    a, b = "ddpkit_group_0:a", "ddpkit_group_1:b"
    survivor = numbers_seen([Answer(1, [a], 0), Answer(1, [b, a], 6), Answer(1, [a, b], 7)])
    newcomer = numbers_seen([Answer(1, [a, b], 6), Answer(1, [b, a], 7)])  # started after
    assert survivor[1:] == newcomer  # torchft's lighthouse said 1 to both, as before


def test_everything_else_passes_through_to_torchfts_client() -> None:
    answer = Answer(4, ["g:a"], 5, heal=True)
    client = Client([answer])
    manager = Manager(client)
    install(manager)
    renumbered = manager._client._quorum(step=5, timeout=3)
    assert (renumbered.heal, renumbered.max_step, renumbered.replica_ids) == (True, 5, ["g:a"])
    assert renumbered.quorum_id == QuorumNumbers().renumber(4, ["g:a"], 5) != 4
    assert client.asked == [{"step": 5, "timeout": 3}] and manager._client.should_commit()


def test_a_manager_without_torchft_0_2s_client_is_left_alone_and_said_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Bare:
        pass

    monkeypatch.setattr("ddpkit._compat._said", set())  # said once a process: this one's
    with caplog.at_level(logging.WARNING, logger="ddpkit"):
        assert not install(Bare())
    assert "torchft.Manager._client._quorum is not in torchft" in caplog.text, caplog.text
    assert "quorum numbers are torchft's own" in caplog.text
