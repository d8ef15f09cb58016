"""The environment a node's workers start with: what ddpkit sets unless the user did.

Example:
    >>> "OMP_NUM_THREADS" in {**os.environ, **worker_env_defaults(LaunchPlan(nproc=2))}
    True
"""

from __future__ import annotations

import os

from ddpkit._core.protocol import LIGHTHOUSE_ENV
from ddpkit._core.system import interface_toward, loopback_interface, threads_per_worker
from ddpkit.launch.plan import LaunchPlan


def worker_env_defaults(plan: LaunchPlan) -> dict[str, str]:
    """Environment defaults for this node's workers; variables the user already set are kept.

    OMP_NUM_THREADS splits the cores between workers (oversubscribed threads make CPU
    training slower, not faster); on a one-node job GLOO_SOCKET_IFNAME keeps gloo's traffic
    on loopback, or puts it on the route to a replica groups' lighthouse on another host
    (TORCHFT_LIGHTHOUSE), over which the groups exchange gradients. Under dynamic rendezvous
    each round of workers gets a store of its own (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, read
    by torch's rendezvous in this process): the store shared across rounds keeps the
    previous round's keys, and after a host leaves or joins, a worker could read its peer's
    old address and fail to connect (pytorch#135712).

    Example:
        >>> defaults = worker_env_defaults(LaunchPlan(nproc=2))
        >>> "OMP_NUM_THREADS" in defaults or "OMP_NUM_THREADS" in os.environ
        True
    """
    defaults = {"OMP_NUM_THREADS": str(threads_per_worker(plan.nproc))}
    loopback = loopback_interface()
    if loopback is not None and plan.mode == "local":
        toward = interface_toward(os.environ.get(LIGHTHOUSE_ENV, ""))
        defaults["GLOO_SOCKET_IFNAME"] = toward or loopback
    if plan.mode == "dynamic":
        defaults["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return {k: v for k, v in defaults.items() if k not in os.environ}
