"""The text of a hang report: who waits where, which ranks are missing, and their stacks.

The watchdog (see :mod:`ddpkit.runtime.watchdog`) collects one state per rank that could answer:
what it is doing, for how long, its *progress* (how many steps, phases and collectives it
has entered: ranks running the same code agree on it at the same point) and its Python
stack. Ranks whose progress is behind the furthest rank have not reached the call the others
wait in: they are the missing ranks. A rank that left the job normally said so on its way out
(``"finished"``): it is missing too, and the mistake is the classic one, a collective only
some ranks call. Ranks that did not answer at all are frozen in native code or gone. When
no rank is behind, either the ranks wait in *different* calls (a collective mismatch) or all
wait in the same one, which then does not complete (network).

Example:
    >>> states = {
    ...     0: {"doing": "all_reduce_sum(float64[1])", "for_s": 6.0, "progress": 3, "stack": []},
    ...     1: {"doing": None, "last": "all_reduce_sum(float64[1])", "progress": 2, "stack": []},
    ... }
    >>> print(compose_report(states, world_size=2, reporter=0, timeout_s=5).splitlines()[0])
    hang: rank 0 waited 6 s in all_reduce_sum(float64[1]) (hang timeout 5 s); rank 1 has not
    reached it
"""

from __future__ import annotations

from typing import Any

from ddpkit._core.protocol import SAME_CALLS_FIX
from ddpkit._core.text import ranks_text
from ddpkit._core.torchversion import torch_at_least, torch_text
from ddpkit.flightrecorder.verdict import collective_verdict

State = dict[str, Any]
_MAX_LISTED = 8  # ranks listed per group; a 1,000-rank job's report stays readable
_MISMATCH_FIX = (
    "every rank must call the same collectives, with the same shapes and dtypes, in the same "
    "order; `ddpkit run --debug-collectives` (TORCH_DISTRIBUTED_DEBUG=DETAIL) checks each call"
)
# torch 2.7's Flight Recorder is NCCL's only; gloo's collectives are recorded from torch 2.8
_OLD_TORCH = (
    f"torch {torch_text()} records no gloo collectives in its Flight Recorder (torch 2.8 "
    "and later do); the ranks' activities below"
)
_NETWORK_FIX = (
    "the ranks reached the same call but it does not complete: check that they can reach "
    "each other on the interface gloo/NCCL use (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME) and "
    "run `ddpkit doctor --smoke`"
)


def compose_report(
    states: dict[int, State], world_size: int, reporter: int, timeout_s: float
) -> str:
    """The whole report: a headline naming the missing ranks, the diagnosis, rank by rank.

    ``reporter`` is the rank that noticed; the headline speaks for a rank that waits.

    Example:
        >>> states = {0: {"doing": "barrier()", "for_s": 9.0, "progress": 5, "stack": []},
        ...           1: {"doing": None, "last": "step 4", "progress": 4, "stack": []}}
        >>> compose_report(states, 2, reporter=0, timeout_s=5).splitlines()[0]
        'hang: rank 0 waited 9 s in barrier() (hang timeout 5 s); rank 1 has not reached it'
    """
    missing = missing_ranks(states, world_size)
    # Speak from a rank that waits for the others, whichever rank noticed first.
    waiting = min((rank for rank in states if rank not in missing), default=reporter)
    lines = [_headline(states[waiting], waiting, timeout_s, missing, finished_ranks(states))]
    verdict = collective_verdict(states, world_size)  # from the ranks' Flight Recorders
    if verdict is None and not torch_at_least("2.8"):
        lines.append(f"collectives: not named: {_OLD_TORCH}")
    if verdict is None:
        lines.append(_diagnosis(states, missing, world_size))
    else:  # the collectives say more precisely what happened, and what to do
        lines += [f"collectives: {verdict.line}", f"fix: {verdict.fix}"]
    lines += _rank_lines(states, missing, world_size)
    return "\n".join(lines)


def missing_ranks(states: dict[int, State], world_size: int) -> list[int]:
    """Ranks behind the furthest rank's progress, and ranks that did not answer.

    Example:
        >>> missing_ranks({0: {"progress": 5}, 1: {"progress": 4}}, world_size=3)
        [1, 2]
    """
    running = [state["progress"] for state in states.values() if not state.get("finished")]
    furthest = max(running, default=0)
    behind = [rank for rank, state in states.items() if state["progress"] < furthest]
    gone = [rank for rank in finished_ranks(states) if rank not in behind]
    return sorted(behind + gone + silent_ranks(states, world_size))


def finished_ranks(states: dict[int, State]) -> list[int]:
    """Ranks that left the job normally (the script ended, or ``ddpkit.shutdown()``).

    Example:
        >>> finished_ranks({0: {"progress": 5}, 1: {"progress": 9, "finished": True}})
        [1]
    """
    return sorted(rank for rank, state in states.items() if state.get("finished"))


def silent_ranks(states: dict[int, State], world_size: int) -> list[int]:
    """Ranks that did not answer the alarm.

    Example:
        >>> silent_ranks({0: {}}, 3)
        [1, 2]
    """
    return [rank for rank in range(world_size) if rank not in states]


def describe_activity(state: State) -> str:
    """What one rank is doing, in words.

    Example:
        >>> describe_activity({"doing": None, "last": "barrier"})
        'in its own code (last ddpkit call: barrier)'
    """
    if state.get("finished"):
        return f"finished the script (last ddpkit call: {state.get('last') or 'none'})"
    if state.get("doing"):
        return f"{state['doing']} for {state.get('for_s', 0):.0f} s"
    return f"in its own code (last ddpkit call: {state.get('last') or 'none'})"


def _headline(
    own: State, rank: int, timeout_s: float, missing: list[int], finished: list[int]
) -> str:
    text = (
        f"hang: rank {rank} waited {own.get('for_s', 0):.0f} s in {own.get('doing')} "
        f"(hang timeout {timeout_s:.0f} s)"
    )
    if finished:
        return f"{text} but {_ranks(finished)} finished the script without calling it: " + (
            SAME_CALLS_FIX
        )
    if missing:
        verb = "has" if len(missing) == 1 else "have"
        text += f"; {_ranks(missing)} {verb} not reached it"
    return text


def _diagnosis(states: dict[int, State], missing: list[int], world_size: int) -> str:
    finished = finished_ranks(states)
    if finished:
        return (
            f"{_ranks(finished)} left the job normally (the script ended, or called "
            "ddpkit.shutdown()) while this call waited for them; look for a collective, a "
            "barrier or a save that only some ranks reach"
        )
    silent = silent_ranks(states, world_size)
    if silent:
        return (
            f"{_ranks(silent)} did not answer within the grace period: frozen in native code "
            "(their stacks are dumped by faulthandler in their own output) or already gone"
        )
    if missing:
        return f"fix: find out why {_ranks(missing)} stopped before the call (stacks below)"
    doing = {state.get("doing") for state in states.values()}
    if len(doing) > 1:
        return f"collective mismatch: ranks wait in different calls; {_MISMATCH_FIX}"
    return f"every rank waits in {doing.pop()}: {_NETWORK_FIX}"


def _rank_lines(states: dict[int, State], missing: list[int], world_size: int) -> list[str]:
    groups: dict[str, list[int]] = {}
    for rank in sorted(states):
        groups.setdefault(describe_activity(states[rank]), []).append(rank)
    lines = []
    for activity, ranks in groups.items():
        lines.append(f"  {_ranks(ranks)}: {activity}")
        for rank in [r for r in ranks if r in missing or len(ranks) == 1][:_MAX_LISTED]:
            lines += _stack_lines(rank, states[rank])
    return lines


def _stack_lines(rank: int, state: State) -> list[str]:
    stack = state.get("stack") or []
    if not stack:
        return []
    head = f"    stack of rank {rank} ({state.get('host', '?')}, pid {state.get('pid', '?')}):"
    return [head, *(f"      {line}" for line in stack)]


def _ranks(ranks: list[int]) -> str:
    return ranks_text(ranks, most=_MAX_LISTED)
