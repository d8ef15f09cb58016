"""**Experimental.** :class:`ReplicaGroups`: replica groups that train on when one fails,
composed around whatever trains inside each group (through torchft,
``pip install 'ddpkit[ft]'``).

Each replica group is an ordinary ddpkit job (``ddpkit run``, any size) whose model is
prepared as usual (``prepare_model``: DDP inside the group, or no wrapper for a group of one
process). The loop is handed the groups (``Trainer(..., replica_groups=groups)``) and, each
step, asks them for the quorum before the batch, weighs the loss by this rank's share of the
step's samples, and after backward lets them average the gradients over the groups alive at
this step and vote (:class:`~ddpkit.faulttolerance.manager.GroupManager`). A group that dies
is left out of the next quorum and the others go on at the smaller size, without a restart;
a group started again heals from a live peer first. The batches are dealt among the groups
alive at each step (:meth:`ReplicaGroups.batches`), each sample once per epoch.

Example:
    >>> ReplicaGroups(group="0", lighthouse="http://10.0.0.1:29510")
    ReplicaGroups(group='0', lighthouse='http://10.0.0.1:29510')
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddpkit._core.protocol import FT_GROUP_ENV, LIGHTHOUSE_ENV
from ddpkit._core.renamed import renamed_keywords
from ddpkit.errors import ConfigError
from ddpkit.parallel.base import checked_options, option_text
from ddpkit.parallel.options import bounded

if TYPE_CHECKING:
    from torch import nn

    from ddpkit.faulttolerance.batches import ReplicaBatches
    from ddpkit.faulttolerance.manager import Dealer, GroupManager, Restorable

DEFAULT_CAP_MB = 25.0  # DDP's own default bucket size


@renamed_keywords({"timeout_s": "timeout"}, removed_in="0.3")
@checked_options
@dataclass(repr=False, kw_only=True, eq=False)
class ReplicaGroups:
    """**Experimental.** This process's replica group of a fault-tolerant job, given to the
    loop: ``Trainer(..., replica_groups=groups)`` or ``TrainLoop(..., replica_groups=groups)``.

    ``group``: this replica group's number (default ``DDPKIT_FT_GROUP``); ``lighthouse``: the
    torchft lighthouse's address (default ``TORCHFT_LIGHTHOUSE``); ``min_groups``: the fewest
    groups a step may be taken with; ``timeout``: seconds one exchange or quorum may take;
    ``quorum_retries``: quorum attempts before a group gives up (a lighthouse outage);
    ``bucket_cap_mb``: the largest bucket the gradients cross between groups in (25 MB). The
    groups start from identical weights (seeded alike, as ``ddpkit.init(seed=...)`` does),
    which the first step checks; a group that joins a running job receives the others' state.

    Example::

        groups = ddpkit.ReplicaGroups(min_groups=1)
        model = ddpkit.prepare_model(Net())          # DDP inside the group, as always
        trainer = ddpkit.Trainer(model, optimizer, loss_fn, replica_groups=groups)
        trainer.fit(groups.batches(train_set, batch_size=32), epochs=10)
    """

    group: str | None = None
    lighthouse: str | None = None
    min_groups: int = bounded(1, least=1, means="groups")
    timeout: float = bounded(30.0, above=0, means="seconds")
    quorum_retries: int = bounded(3, least=0)
    bucket_cap_mb: float | None = bounded(None, above=0, means="MB")

    def __post_init__(self) -> None:
        self._manager: GroupManager | None = None  # torchft's, from the loop's start
        self._dealer: Dealer | None = None

    def __repr__(self) -> str:
        fields = dataclasses.fields(self)
        given = [f for f in fields if getattr(self, f.name) != f.default]
        shown = [f"{f.name}={option_text(getattr(self, f.name))}" for f in given]
        return f"{type(self).__name__}({', '.join(shown)})"

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        """The options, as a strategy's are listed.

        Example:
            >>> ReplicaGroups.fields()[:2]
            ('group', 'lighthouse')
        """
        return tuple(f.name for f in dataclasses.fields(cls))

    def name(self) -> str:
        """This group's number, as given or from ``DDPKIT_FT_GROUP``.

        Example:
            >>> ReplicaGroups(group="1").name()
            '1'
        """
        group = self.group if self.group is not None else os.environ.get(FT_GROUP_ENV)
        if not group:
            raise ConfigError(f"ReplicaGroups needs this process's replica group: group='0', "
                              f"or {FT_GROUP_ENV}=0 in each group's environment")  # fmt: skip
        if not group.isdigit():  # torchft places a group's ranks by its number
            raise ConfigError(f"a replica group is a number (0, 1, ...), not {group!r}: "
                              f"group='1', or {FT_GROUP_ENV}=1")  # fmt: skip
        return group

    def address(self) -> str:
        """The lighthouse's address, as given or from ``TORCHFT_LIGHTHOUSE``.

        Example:
            >>> ReplicaGroups(lighthouse="http://h:29510").address()
            'http://h:29510'
        """
        lighthouse = self.lighthouse or os.environ.get(LIGHTHOUSE_ENV)
        if not lighthouse:
            raise ConfigError(f"ReplicaGroups needs the lighthouse's address: "
                              f"lighthouse='http://HOST:PORT', or {LIGHTHOUSE_ENV} (ddpkit "
                              "lighthouse starts one; ddpkit verify starts its own with "
                              "--replica-groups G)")  # fmt: skip
        return lighthouse

    def batches(
        self, dataset: Any, batch_size: int, *, shuffle: bool = True, seed: int = 0
    ) -> ReplicaBatches:
        """An epoch's batches of ``dataset`` (``batch_size`` a rank), dealt among the groups
        alive at each step so that each sample is trained on once per epoch.

        Example::

            trainer.fit(groups.batches(train_set, batch_size=32, seed=0), epochs=10)
        """
        from ddpkit.faulttolerance.batches import ReplicaBatches

        return ReplicaBatches(self, dataset, batch_size, shuffle=shuffle, seed=seed)

    @property
    def manager(self) -> GroupManager:
        """torchft's manager of this group, once the loop started the groups."""
        if self._manager is None:
            raise ConfigError(
                "the replica groups have not started: give them to the loop, "
                "Trainer(..., replica_groups=groups) or TrainLoop(..., replica_groups=groups)"
            )
        return self._manager

    @property
    def started(self) -> bool:
        """Whether the loop has started the groups (torchft's manager is running)."""
        return self._manager is not None

    def deal_with(self, dealer: Dealer) -> None:
        """Batches dealt by ``dealer``: its place is healed with the run, and it weighs each
        rank's loss."""
        self._dealer = dealer
        if self._manager is not None:
            self._manager.deal_with(dealer)

    # The loop's side (ddpkit.train.update.Updater): one call at each point of a step.

    def attach(self, run: Restorable, model: nn.Module) -> None:
        """The loop starts: torchft's manager starts (once), with ``run`` as what a healing
        peer receives."""
        from ddpkit.faulttolerance.manager import GroupManager
        from ddpkit.runtime.session import current_world

        if self._manager is None:
            cap_mb = self.bucket_cap_mb if self.bucket_cap_mb is not None else DEFAULT_CAP_MB
            self._manager = GroupManager(
                self.name(), self.address(), current_world(), min_groups=self.min_groups,
                timeout=self.timeout, retries=self.quorum_retries,
                cap_bytes=int(cap_mb * 2**20),
            )  # fmt: skip
            if self._dealer is not None:
                self._manager.deal_with(self._dealer)
        self._manager.attach(run)

    def start(self) -> None:
        """Before an update's first batch: this step's quorum (asked once a step)."""
        self.manager.start()

    def loss_weight(self) -> float:
        """Before backward: this rank's share of the step's samples (0 for a filler)."""
        return self.manager.loss_weight()

    def finish(self, model: nn.Module) -> bool:
        """After backward: the gradients averaged over the groups; whether to step."""
        return self.manager.average_and_vote(model)

    def close(self) -> None:
        """torchft's manager shut down (the lighthouse sees the group leave at once); also
        done when the process ends.

        Example::

            groups.close()
        """
        if self._manager is not None:
            self._manager.close()
