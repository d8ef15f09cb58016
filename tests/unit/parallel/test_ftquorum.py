"""torchft's quorum numbers renumbered so a restarted lighthouse's numbers never reuse an
earlier quorum's store prefix, and every member of a quorum gets the same number."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddpkit.parallel.ftquorum import QuorumNumbers, install


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


def numbers_seen(answers: list[Answer]) -> list[int]:
    client = QuorumNumbers(Client(answers))
    return [client._quorum(step=0).quorum_id for _ in range(len(client.answers))]


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
    numbers = QuorumNumbers(client)
    renumbered = numbers._quorum(step=5, timeout=3)
    assert (renumbered.heal, renumbered.max_step, renumbered.replica_ids) == (True, 5, ["g:a"])
    assert client.asked == [{"step": 5, "timeout": 3}] and numbers.should_commit()


def test_a_manager_without_a_client_is_left_alone() -> None:
    class Manager:
        pass

    manager = Manager()
    assert not install(manager)
    manager._client = Client([])  # type: ignore[attr-defined]
    assert install(manager) and isinstance(manager._client, QuorumNumbers)  # type: ignore[attr-defined]
