"""torchrun's flags as the installed torch declares them, read from the source of
``torch/distributed/run.py`` as text, without importing torch (0.85 s of ``ddpkit run``'s
start-up): ``ddpkit run --hosts`` and a warm server read their command line this way.

Example:
    >>> torchrun_flags()["--nnodes"], torchrun_flags()["--standalone"]
    (True, False)
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

from ddpkit._compat import Internal

RUN_SOURCE = Internal(
    "the add_argument calls of torch/distributed/run.py, read as text", "torch",
    "ddpkit run reads its command line with torch's own parser, importing torch first "
    "(about 0.85 s more to start)",
)  # fmt: skip


@functools.cache
def torchrun_flags() -> dict[str, bool]:
    """The installed torch's torchrun flags, each with whether it takes a value, read from
    the source of ``torch.distributed.run`` without importing it; empty if not found.

    Example:
        >>> torchrun_flags()["--nnodes"], torchrun_flags()["--standalone"]
        (True, False)
    """
    RUN_SOURCE.used()
    spec = importlib.util.find_spec("torch")  # a top-level name: found, not imported
    if spec is None or spec.origin is None:
        return {}
    source = Path(spec.origin).parent / "distributed" / "run.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        RUN_SOURCE.gone()
        return {}
    flags = {flag: takes for call in ast.walk(tree) for flag, takes in _declared(call).items()}
    if "--nproc-per-node" not in flags:  # not the parser it was: the full one decides
        RUN_SOURCE.gone()
        return {}
    return flags


def _declared(node: ast.AST) -> dict[str, bool]:
    """The flags of one ``parser.add_argument(...)`` call: a ``check_env`` or ``store_*``
    action takes no value, every other one (``env``, the default) takes one."""
    if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
        return {}
    spellings = [a.value for a in node.args if isinstance(a, ast.Constant)]
    action = next((k.value for k in node.keywords if k.arg == "action"), None)
    name = getattr(action, "id", getattr(action, "value", ""))
    switch = name == "check_env" or str(name).startswith(("store_true", "store_false"))
    return {s: not switch for s in spellings if isinstance(s, str) and s.startswith("-")}
