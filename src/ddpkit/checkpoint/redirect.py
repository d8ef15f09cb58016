"""Where a run's checkpoints and logs really go: the script's own folders, or a ddpkit
command's scratch.

``ddpkit verify``, ``ddpkit bench`` and ``ddpkit doctor --run`` run the user's script as it
is. Were it to write and resume its own checkpoint folder there, a tool's run would resume
from the user's earlier training (or the tool's first run would feed its second) and change
what the user's next ``python train.py`` resumes from. So these commands set
``DDPKIT_CHECKPOINT_DIR`` to a folder of their own, and every checkpoint folder a script names
maps to a subfolder of it: the tool's runs start from nothing and the user's folder is left
as it was. The experiment log's folder is redirected the same way (``DDPKIT_LOG_DIR``), so
a tool's run neither writes into the user's curves nor truncates them.

Example:
    >>> import os
    >>> str(resolve_checkpoint_dir("runs/wine"))
    'runs/wine'
    >>> os.environ[CHECKPOINT_DIR_ENV] = "/tmp/verify-1/checkpoints"
    >>> str(resolve_checkpoint_dir("runs/wine"))
    '/tmp/verify-1/checkpoints/runs-wine'
    >>> str(resolve_checkpoint_dir(resolve_checkpoint_dir("runs/wine")))
    '/tmp/verify-1/checkpoints/runs-wine'
    >>> del os.environ[CHECKPOINT_DIR_ENV]
"""

from __future__ import annotations

import os
from pathlib import Path

from ddpkit._core.protocol import CHECKPOINT_DIR_ENV, LOG_DIR_ENV
from ddpkit.checkpoint.storage import is_url


def resolve_checkpoint_dir(folder: str | os.PathLike[str]) -> Path | str:
    """The folder checkpoints named ``folder`` go to in this run (see the module's docstring).

    A script that inspects its checkpoint folder itself (to refuse to overwrite an earlier
    run, say) should look where this says, so that it sees what its Trainer will see. An
    object-store URL (``s3://bucket/run``) is returned as it is, unless a ddpkit command
    redirects it to its (local) scratch.

    Example:
        >>> resolve_checkpoint_dir("/data/ckpt").name
        'ckpt'
        >>> resolve_checkpoint_dir("s3://bucket/runs/wine")
        's3://bucket/runs/wine'
    """
    if is_url(folder) and not os.environ.get(CHECKPOINT_DIR_ENV):
        return str(folder)
    return _redirected(folder, CHECKPOINT_DIR_ENV)


def resolve_log_dir(folder: str | os.PathLike[str]) -> Path:
    """The folder the experiment log named ``folder`` goes to in this run.

    Example:
        >>> resolve_log_dir("runs/wine/logs").name
        'logs'
    """
    return _redirected(folder, LOG_DIR_ENV)


def _redirected(folder: str | os.PathLike[str], variable: str) -> Path:
    scratch = os.environ.get(variable)
    if not scratch or Path(folder).is_relative_to(scratch):  # unset, or resolved already
        return Path(folder)
    return Path(scratch) / "-".join(p for p in Path(folder).parts if p not in ("/", "."))
