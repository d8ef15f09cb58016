"""Arming torch's Flight Recorder: the variables, set before the process group exists.

torch records every collective of every process group (gloo included, since torch 2.8) in a
ring buffer whose size ``TORCH_FR_BUFFER_SIZE`` sets when the first group is made (older
releases read ``TORCH_NCCL_TRACE_BUFFER_SIZE``); 0, torch's default, records nothing. ddpkit
arms it in every worker (``ddpkit.init()``, and ``ddpkit run``'s worker bootstrap for plain
torchrun scripts) so that a hang can be named at the collective; ``DDPKIT_FLIGHT_RECORDER=0``
leaves torch's setting alone. A variable the user set is kept.

Example:
    >>> flight_recorder_defaults({})  # torch 2.7 reads TORCH_NCCL_TRACE_BUFFER_SIZE
    {'TORCH_FR_BUFFER_SIZE': '2000'}
    >>> flight_recorder_defaults({"DDPKIT_FLIGHT_RECORDER": "0"})
    {}
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping

from ddpkit._core.torchversion import torch_at_least

FLIGHT_RECORDER_ENV = "DDPKIT_FLIGHT_RECORDER"  # 0: do not arm torch's Flight Recorder
BUFFER_SIZE = 2000  # collectives kept per process; torchtitan's default too
_SIZE_VARIABLES = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")


def flight_recorder_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to set for the Flight Recorder, unless off or already set.

    Example:
        >>> flight_recorder_defaults({"TORCH_FR_BUFFER_SIZE": "500"})
        {}
    """
    if environ.get(FLIGHT_RECORDER_ENV, "1").strip().lower() in ("0", "false", "off", "no"):
        return {}
    if any(name in environ for name in _SIZE_VARIABLES):
        return {}
    # the older name is deprecated (a warning per process) where the new one is read
    name = _SIZE_VARIABLES[0] if torch_at_least("2.8") else _SIZE_VARIABLES[1]
    return {name: str(BUFFER_SIZE)}


def arm_flight_recorder(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set the defaults in this process's environment; True when the recorder is on.

    Example:
        >>> arm_flight_recorder({"DDPKIT_FLIGHT_RECORDER": "0"})
        False
    """
    env = os.environ if environ is None else environ
    env.update(flight_recorder_defaults(env))
    return any(env.get(name, "0") not in ("", "0") for name in _SIZE_VARIABLES)
