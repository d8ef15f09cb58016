"""**Experimental.** One replica group's torchft ``Manager``, started with the run: each
step's quorum, the exchange of gradients between the groups and the vote.

A step asks the lighthouse for the quorum (:meth:`GroupManager.start`), the dealer learns
this group's place in it (:meth:`GroupManager.position`), and after backward the gradients
are averaged over the groups in it, a few flat buckets at a time
(:mod:`~ddpkit.faulttolerance.buckets`), before a vote: a step whose exchange failed
anywhere is dropped everywhere. A group that joins a running job heals first: it receives
the run's whole state from a live peer (:mod:`~ddpkit.faulttolerance.heal`).

Example::

    manager = GroupManager("0", "http://10.0.0.1:29510", world, min_groups=1,
                           timeout=30.0, retries=3, cap_bytes=25 << 20)
    manager.attach(run); manager.start()
    if manager.average_and_vote(model): optimizer.step()
"""

from __future__ import annotations

import os
import weakref
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ddpkit._core.log import logger
from ddpkit.errors import ConfigError, RendezvousError
from ddpkit.faulttolerance.buckets import Buckets
from ddpkit.faulttolerance.exchange import check_gloo_interface, exchange_store, meeting_address
from ddpkit.faulttolerance.members import Members
from ddpkit.faulttolerance.quorum import install as install_quorum_numbers
from ddpkit.parallel.shards import local, local_state, resharded

if TYPE_CHECKING:
    from ddpkit.env.world import World

INSTALL = "pip install 'ddpkit[ft]' (torchft)"


class Restorable(Protocol):
    """What a group hands a healing peer: the run's whole state (ddpkit's RunState)."""

    step: int  # optimizer steps taken (after a resume: the checkpoint's)

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Dealer(Protocol):
    """What deals the batches among the groups
    (:class:`~ddpkit.faulttolerance.batches.ReplicaBatches`)."""

    def loss_weight(self, participants: int) -> float: ...

    def committed(self, participants: int) -> None: ...

    def state_dict(self) -> dict[str, int]: ...

    def load_state_dict(self, state: dict[str, int]) -> None: ...


class GroupManager:
    """This group's torchft Manager: the quorum, the exchange and the vote of every step.
    ``group`` and ``lighthouse`` as :class:`~ddpkit.faulttolerance.groups.ReplicaGroups`
    resolved them; ``cap_bytes``: the largest bucket the gradients cross in.

    Example::

        manager = GroupManager("0", "http://h:29510", world, min_groups=1, timeout=30.0,
                               retries=3, cap_bytes=25 << 20)
        manager.attach(run); manager.start()
        if manager.average_and_vote(model): optimizer.step()
    """

    def __init__(
        self, group: str, lighthouse: str, world: World, *, min_groups: int, timeout: float,
        retries: int, cap_bytes: int,
    ) -> None:  # fmt: skip
        torchft = import_torchft()
        self.group, self.lighthouse = group, lighthouse
        self.rank, self.size = world.rank, world.world_size  # within the group
        self.timeout, self.retries = timeout, retries
        limit = timedelta(seconds=timeout)
        pg = torchft.ProcessGroupGloo(timeout=limit) if world.device.type == "cpu" else (
            torchft.ProcessGroupNCCL(timeout=limit))  # fmt: skip
        from ddpkit.faulttolerance.heal import HealTransport

        self.transport = HealTransport(limit)
        # Where the groups meet: an address the others reach, not the group's own store
        address = meeting_address(lighthouse)
        if world.device.type == "cpu":
            check_gloo_interface(lighthouse, address)
        self._store, store_port = exchange_store(world, address, limit)
        try:
            self.manager = torchft.Manager(
                pg=pg, load_state_dict=None, state_dict=None, min_replica_size=min_groups,
                checkpoint_transport=self.transport, store_addr=address, store_port=store_port,
                replica_id=f"ddpkit_group_{self.group}", lighthouse_addr=lighthouse,
                rank=world.rank, world_size=world.world_size, timeout=limit,
                quorum_timeout=limit, connect_timeout=limit,
                quorum_retries=retries, init_sync=False,
            )  # fmt: skip
        except RuntimeError as err:
            said = f"within {self.timeout:g} s: {err}"
            raise ConfigError(f"replica group {self.group} could not reach the lighthouse at "
                              f"{lighthouse} {said}") from err  # fmt: skip
        # torchft's servers (the manager's, the heal transport's) stop when the process ends,
        # however the run ends, or once this object is gone: the lighthouse then sees the
        # group leave at once, and no thread of torchft's holds the process open.
        self.close = weakref.finalize(self, _shut_down, self.manager)
        # quorum numbers that a restarted lighthouse does not give out again
        install_quorum_numbers(self.manager)
        self._open = False  # a quorum asked for and not voted on yet
        self.votes = 0  # steps voted on so far (a dealer checks one batch a step)
        self.members = Members(int(self.group), world.device)
        self.buckets = Buckets(cap_bytes=cap_bytes)
        self._started = False  # whether the groups' start was checked
        self._last_step = 0
        self._dealer: Dealer | None = None
        self._run: Restorable | None = None
        logger.info(f"replica group {self.group}: fault-tolerant across groups (experimental), "
                    f"lighthouse {lighthouse}")  # fmt: skip

    def attach(self, run: Restorable) -> None:
        """A peer that heals from this group receives ``run`` whole (before any quorum)."""
        # A sharded model's state crosses as each rank's own shards (parallel/shards.py)
        self.manager.register_state_dict_fn(
            "ddpkit", lambda state: run.load_state_dict(resharded(state, run)),
            lambda: local_state(run.state_dict()),
        )  # fmt: skip
        self._run = run

    def deal_with(self, dealer: Dealer) -> None:
        """Batches dealt by ``dealer`` (its state healed too; idle: zero gradients)."""
        self.manager.register_state_dict_fn("ddpkit_batches", dealer.load_state_dict,
                                            dealer.state_dict)  # fmt: skip
        self._dealer = dealer

    def start(self) -> None:
        """Before a step's batch or backward: ask for this step's quorum (once a step)."""
        if not self._open:
            if not self.votes:
                self._resume_step()
            self.manager.start_quorum()
            self._open = True

    def _resume_step(self) -> None:
        """Before the first quorum of a run resumed from its checkpoint: torchft's step is
        the checkpoint's, so that a group resumed from an older one (or started anew) heals
        from the most advanced instead of all starting again at step 0."""
        if self._run is not None and self._run.step and not self.manager.current_step():
            self.manager.load_state_dict({"step": self._run.step, "batches_committed": 0})
            self._last_step = self._run.step  # a heal then says where it took the run from

    def position(self) -> int | None:
        """This group's place in this step's quorum (None: healing, it only receives)."""
        try:
            rank = self.manager.participating_rank()
        except TimeoutError as err:  # torchft gave up on the quorum, retries included
            raise RendezvousError(
                f"replica group {self.group}: no quorum at the lighthouse {self.lighthouse} "
                f"within {self.timeout:g} s, {self.retries} retries included ({err}); is the "
                "lighthouse running? A longer outage needs a larger "
                "ReplicaGroups(timeout=...)"
            ) from err
        return None if rank is None else int(rank)

    def loss_weight(self) -> float:
        """Before backward: what this rank's loss counts for (its dealer's weighing; 1 for
        batches the groups do not share out)."""
        if self._dealer is None:
            return 1.0
        return self._dealer.loss_weight(self.manager.num_participants())

    def average_and_vote(self, model: nn.Module) -> bool:
        """After backward: the gradients averaged over the groups in the quorum; whether
        every group may take the step (False: drop it everywhere)."""
        if not self._started:
            self._check_same_start(model)
        # every gradient and the members' slots in few all-reduces, averaged in place
        # (torchft divides by the participants)
        tensors = [*_with_gradients(model), self.members.slots()]
        self.buckets.finish(self.buckets.start(self.manager, tensors))
        commit = bool(self.manager.should_commit())
        self._open, self.votes = False, self.votes + 1
        participants = self.manager.num_participants()
        if commit and self._dealer is not None:
            self._dealer.committed(participants)
        step = self.manager.current_step()
        self._say_heal(step)
        self.members.say(step, participants, commit)
        return commit

    def _check_same_start(self, model: nn.Module) -> None:
        """At the job's first step (every group at step 0, none healing), whether all groups
        start from the same weights: each parameter's sum, and its square, averaged over the
        groups; the two agree only where every group's sums are equal."""
        self._started = True
        if self.manager.current_step() != 0 or self.position() is None:
            return  # joining a running job: it heals from a peer
        sums = torch.stack([local(p.detach()).double().sum() for p in model.parameters()])
        pair = torch.cat([sums, sums * sums])
        self.manager.allreduce(pair).wait()
        mean, mean_square = pair.chunk(2)
        if not torch.allclose(mean_square, mean * mean, rtol=1e-9, atol=1e-12):
            raise ConfigError(
                f"replica group {self.group}: the replica groups start from different weights; "
                "seed every group alike (ddpkit.init(seed=0) before building the model), or "
                "load the same weights in each"
            )

    def _say_heal(self, step: int) -> None:
        """One line when this group healed (caught up with the others)."""
        heal = self.transport.last_heal
        if step > self._last_step + 1 and heal is not None:
            logger.info(f"replica group {self.group}: healed at step {step} (was at step "
                        f"{self._last_step}): the run's state {heal.describe()}")  # fmt: skip
            self.transport.last_heal = None
        self._last_step = step


def _shut_down(manager: Any) -> None:
    try:
        manager.shutdown(wait=False)
    except Exception as err:  # at exit: said, never raised over the run's own ending
        logger.warning(f"torchft's manager did not shut down cleanly: {err}")


def _with_gradients(model: nn.Module) -> list[torch.Tensor]:
    """Every parameter's gradient, a zero one where backward left none: each group must
    all-reduce the same tensors in the same order. A sharded model's: this rank's shard of
    each (rank r of every group holds the same one)."""
    for param in model.parameters():
        if param.requires_grad and param.grad is None:
            param.grad = torch.zeros_like(param)
    return [local(param.grad) for param in model.parameters() if param.grad is not None]


def import_torchft(who: str = "ReplicaGroups") -> Any:
    """torchft, with its own log at warnings (else a line per quorum), or a ConfigError that
    says which extra to install.

    Example::

        torchft = import_torchft("ddpkit lighthouse")
    """
    os.environ.setdefault("RUST_LOG", "warn")
    try:
        import torchft
    except ImportError as err:  # missing, or installed and broken: said as it is
        raise ConfigError(f"{who} needs torchft, which did not import ({err}): {INSTALL}") from err
    return torchft
