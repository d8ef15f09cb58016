"""Which replica groups took part in a step, read from the slots the groups exchange, and
the lines when that changes (torchft's averaging replayed without torchft)."""

from __future__ import annotations

import logging

import torch

from ddpkit.faulttolerance.members import NAMED_GROUPS, Members


class Averaging:
    """torchft's AVG all-reduce of the slots over the groups taking part this step."""

    def __init__(self, groups: list[int]) -> None:
        self.groups = groups

    def allreduce(self, slots: torch.Tensor) -> object:
        slots.zero_()
        for group in self.groups:
            slots[min(group, NAMED_GROUPS)] += 1.0 / len(self.groups)
        return type("Done", (), {"wait": lambda self: True})()


def step(members: Members, groups: list[int], number: int, committed: bool = True) -> None:
    members.exchange(Averaging(groups)).wait()
    members.say(number, len(groups), committed)


def test_the_lines_name_the_groups_that_left_and_joined_and_a_dropped_step(caplog) -> None:
    caplog.set_level(logging.INFO, logger="ddpkit")
    members = Members(0, torch.device("cpu"))
    step(members, [0, 1], 1)
    step(members, [0, 1], 2)  # nothing changed: nothing said
    step(members, [0, 1], 2, committed=False)
    step(members, [0], 3)
    step(members, [0, 2, 300], 4)
    assert caplog.messages == [
        "replica group 0: step 1 with 2 replica group(s): groups 0, 1",
        "replica group 0: step 3 was dropped on every group: the exchange between the groups "
        "failed (a group died during it); its batches are dealt again",
        "replica group 0: step 3 with 1 replica group(s) (was 2): group 1 left (silent past "
        "the lighthouse's heartbeat timeout)",
        "replica group 0: step 4 with 3 replica group(s) (was 1): group 2 joined; groups "
        f"numbered {NAMED_GROUPS} and above: 1",
    ]
    assert members.present == [0, 2] and members.others == 1
