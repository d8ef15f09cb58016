"""torch's streaming loader (``torch.distributed._serialization``), which reads the state a
healing replica group receives over HTTP as it arrives, and only with ``weights_only=True``.

Example::

    state = streaming_load(response)   # tensors and plain containers only
"""

from __future__ import annotations

import io
from typing import Any

from ddpkit._compat import Internal
from ddpkit.errors import ConfigError

STREAMING_LOAD = Internal(
    "torch.distributed._serialization._streaming_load", "torch",
    "a replica group cannot receive its peer's state, so it cannot heal",
)  # fmt: skip


def streaming_load(stream: io.BufferedIOBase) -> Any:
    """The state torchft's transport streams, loaded with ``weights_only=True``: a peer's
    data is never unpickled.

    Example::

        streaming_load(urllib.request.urlopen(address))
    """
    STREAMING_LOAD.used()
    try:
        from torch.distributed._serialization import _streaming_load
    except ImportError:
        STREAMING_LOAD.gone()
        raise ConfigError(f"{STREAMING_LOAD.where} is not in this torch: "
                          f"{STREAMING_LOAD.without}") from None  # fmt: skip
    return _streaming_load(stream, weights_only=True)
