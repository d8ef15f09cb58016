"""**Experimental.** Which replica groups of a fault-tolerant job took part in each step, and
the line that says so when it changes: which group left or joined, at which step, and why
a step was dropped.

torchft tells a group how many groups are in the step's quorum, not which. Each step every
group adds a small tensor to its gradients' exchange: a one in its own slot (its number,
``DDPKIT_FT_GROUP``). Averaged over the participants and multiplied back, the slots that
hold a one are the groups that took part; a healing group's tensor is zeroed by torchft, so
it is counted once it trains. Groups numbered from :data:`NAMED_GROUPS` on share one slot
and are counted, not named.

Example::

    members = Members(group=1, device=torch.device("cpu"))
    work = members.exchange(manager)          # with the gradients' all-reduces
    work.wait(); members.say(step=57, participants=2, committed=True)
"""

from __future__ import annotations

from typing import Any

import torch

from ddpkit._core.log import logger

NAMED_GROUPS = 256  # one slot each (1 KiB a step); the groups above share the last slot


def _listed(groups: list[int]) -> str:
    """``group 1`` or ``groups 1, 2``.

    Example:
        >>> _listed([1]), _listed([1, 2])
        ('group 1', 'groups 1, 2')
    """
    return f"group{'s' if len(groups) > 1 else ''} {', '.join(map(str, groups))}"


class Members:
    """This step's groups, exchanged beside the gradients, and the line when they change.

    Example:
        >>> Members(3, torch.device("cpu")).present
        []
    """

    def __init__(self, group: int, device: torch.device) -> None:
        self.group, self.others = group, 0
        self.present: list[int] = []
        self._slots = torch.zeros(NAMED_GROUPS + 1, device=device)
        self._step = 0

    def slots(self) -> torch.Tensor:
        """This step's slots, a one in this group's: to be averaged over the groups in
        place, beside the gradients (in their last bucket)."""
        self._slots.zero_()
        self._slots[min(self.group, NAMED_GROUPS)] = 1.0
        return self._slots

    def exchange(self, manager: Any) -> Any:
        """Start the exchange of this group's slots alone (torchft averages them); its work."""
        return manager.allreduce(self.slots())

    def say(self, step: int, participants: int, committed: bool) -> None:
        """After the vote: the line for a dropped step, or for groups that left or joined."""
        if not committed:
            logger.info(f"replica group {self.group}: step {self._step + 1} was dropped on "
                        "every group: the exchange between the groups failed (a group died "
                        "during it); its batches are dealt again")  # fmt: skip
            return
        counts = (self._slots * participants).round().long().tolist()
        present, others = [g for g in range(NAMED_GROUPS) if counts[g]], counts[NAMED_GROUPS]
        if present != self.present or others != self.others:
            self._say_change(step, participants, present, others)
        self.present, self.others, self._step = present, others, step

    def _say_change(self, step: int, size: int, present: list[int], others: int) -> None:
        was = len(self.present) + self.others
        if not was:  # the first step this group sees: who is there, not who came
            logger.info(f"replica group {self.group}: step {step} with {size} replica group(s): "
                        f"{_listed(present) if present else 'none named'}")  # fmt: skip
            return
        left = sorted(set(self.present) - set(present))
        joined = sorted(set(present) - set(self.present))
        parts = []
        if left:
            parts.append(f"{_listed(left)} left (silent past the lighthouse's heartbeat timeout)")
        if joined:
            parts.append(f"{_listed(joined)} joined")
        if others != self.others:
            parts.append(f"groups numbered {NAMED_GROUPS} and above: {others}")
        logger.info(f"replica group {self.group}: step {step} with {size} replica group(s) "
                    f"(was {was}): {'; '.join(parts)}")  # fmt: skip
