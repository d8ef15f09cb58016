"""Arming torch's Flight Recorder: the variables, set before the process group exists.

torch records every collective of every process group (gloo included in recent releases) in
a ring buffer whose size ``TORCH_FR_BUFFER_SIZE`` sets when the first group is made (older
releases read ``TORCH_NCCL_TRACE_BUFFER_SIZE``, and recorded nothing by default); 0 records
nothing. ddpkit arms it in every worker (``ddpkit.init()``, and ``ddpkit run``'s worker
bootstrap for plain torchrun scripts) so that a hang can be named at the collective;
``DDPKIT_FLIGHT_RECORDER=0`` turns it off (size 0). A size the user set is kept.

Example:
    >>> flight_recorder_defaults({})  # doctest: +ELLIPSIS
    {'TORCH_...BUFFER_SIZE': '2000'}
    >>> list(flight_recorder_defaults({FLIGHT_RECORDER_ENV: "0"}).values())
    ['0']
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, MutableMapping

from ddpkit._core.protocol import FLIGHT_RECORDER_ENV
from ddpkit._core.torchversion import torch_at_least

# Collectives kept per process. torchtitan keeps 20000; the verdict reads the last few of
# each group, and 2000 entries of frames is a small dump for a worker to write as it exits.
BUFFER_SIZE = 2000
_SIZE_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to set for the Flight Recorder, unless off or already set.

    Example:
        >>> flight_recorder_defaults({"TORCH_FR_BUFFER_SIZE": "500"})
        {}
    """
    if any(name in environ for name in _SIZE_VARIABLES):
        return {}
    off = environ.get(FLIGHT_RECORDER_ENV, "1").strip().lower() in ("0", "false", "off", "no")
    # the older name is deprecated (a warning per process) where the new one is read
    name = _SIZE_VARIABLES[0] if torch_at_least("2.8") else _SIZE_VARIABLES[1]
    return {name: "0" if off else str(BUFFER_SIZE)}


def nccl_defaults(environ: Mapping[str, str], host: str | None = None) -> dict[str, str]:
    """NCCL's side, coherent with ddpkit's watchdog: errors surface asynchronously (a failed
    rank's peers stop instead of waiting), every rank dumps its recorder when a collective
    times out, and under ``ddpkit run`` the dumps go beside the run's error files, named
    with host and rank (``flight-recorder/<host>-rank0``) for ``ddpkit doctor --dumps``.
    ddpkit's collective timeout (30 min) stays above the hang timeout (10 min), so the
    watchdog's report comes first. Variables the user set are kept, and so is torch's: its
    elastic agent gives every worker it starts ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``
    (TearDown, which also stops the rank) unless the launcher's environment names one.

    Example:
        >>> env = {"TORCHELASTIC_ERROR_FILE": "/logs/run/attempt_0/1/error.json"}
        >>> nccl_defaults(env, host="gpu7")["TORCH_FR_DUMP_TEMP_FILE"]
        '/logs/run/attempt_0/flight-recorder/gpu7-rank'
    """
    chosen = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    error_file = environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # <log dir>/<run>/attempt_N/<local rank>/error.json
        attempt = os.path.dirname(os.path.dirname(error_file))
        name = host or socket.gethostname()
        chosen["TORCH_FR_DUMP_TEMP_FILE"] = os.path.join(attempt, "flight-recorder", f"{name}-rank")
    return {key: value for key, value in chosen.items() if key not in environ}


def arm_flight_recorder(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set the defaults in this process's environment; True when the recorder is on.

    Example:
        >>> arm_flight_recorder({FLIGHT_RECORDER_ENV: "0"})
        False
        >>> arm_flight_recorder({})
        True
    """
    env = os.environ if environ is None else environ
    env.update(flight_recorder_defaults(env))
    env.update(nccl_defaults(env))
    dump_prefix = env.get("TORCH_FR_DUMP_TEMP_FILE")
    if dump_prefix and env is os.environ:  # torch writes there, but does not make the folder
        os.makedirs(os.path.dirname(dump_prefix) or ".", exist_ok=True)
    return any(env.get(name, "0") not in ("", "0") for name in _SIZE_VARIABLES)
