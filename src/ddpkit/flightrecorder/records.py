"""This process's Flight Recorder, read: the last collectives of each process group.

torch keeps every collective it issued (armed by :mod:`ddpkit.flightrecorder.arming`): op, group,
sequence number, sizes and dtypes, whether it completed, and the Python frames that issued
it. :func:`recent_collectives` returns the last few per group as plain JSON data, small
enough to travel in the hang report's store key and the error file.

Example:
    >>> recent_collectives() == [] or isinstance(recent_collectives(), list)
    True
"""

from __future__ import annotations

import io
import json
import pickle
from typing import Any

from ddpkit._compat.c10d import flight_recorder_dumpers
from ddpkit._core.tracebacks import is_hidden

Call = dict[str, Any]  # one collective, as :func:`compact` keeps it
_KEPT_PER_GROUP = 4  # the one waited in and the few before it: enough to name the gap


def dump() -> dict[str, Any] | None:
    """torch's Flight Recorder dumps, stack frames included, their entries in one dict; None
    where this torch has no recorder.

    torch gives each pickled; it is read by :func:`load_dump`, which builds plain containers
    only and refuses anything else.

    Example:
        >>> sorted(dump() or {"entries": []})
        ['entries']
    """
    dumpers = flight_recorder_dumpers()
    if not dumpers:  # a torch without the Flight Recorder
        return None
    entries: list[dict[str, Any]] = []
    for dumper in dumpers:
        try:
            entries += load_dump(dumper(True, True, False)).get("entries", [])
        except (RuntimeError, ValueError, pickle.UnpicklingError):
            continue
    return {"entries": entries}


class _PlainUnpickler(pickle.Unpickler):
    """Dicts, lists, tuples, strings and numbers: no class is looked up, so no code runs."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused: the dump names {module}.{name}, not plain data")


def load_dump(data: bytes) -> dict[str, Any]:
    """A Flight Recorder dump (torch's pickle, or JSON) as plain data; a ValueError (or
    UnpicklingError) for anything else.

    Example:
        >>> load_dump(b'{"entries": []}')
        {'entries': []}
        >>> import pickle, collections
        >>> load_dump(pickle.dumps(collections.OrderedDict()))
        Traceback (most recent call last):
        ...
        _pickle.UnpicklingError: refused: the dump names collections.OrderedDict, not plain data
    """
    if data[:1] in (b"{", b"["):
        loaded = json.loads(data)
    else:
        loaded = _PlainUnpickler(io.BytesIO(data)).load()
    if not isinstance(loaded, dict):
        raise ValueError("a Flight Recorder dump is a dict with 'entries'")
    return loaded


def recent_collectives(data: dict[str, Any] | None = None) -> list[Call]:
    """The last few collectives of each process group, oldest first (empty when none).

    Example:
        >>> entry = {"collective_seq_id": 5, "profiling_name": "nccl:all_reduce",
        ...          "process_group": ["0", "default_pg"], "input_sizes": [[3]]}
        >>> [(c["seq"], c["op"]) for c in recent_collectives({"entries": [entry]})]
        [(5, 'all_reduce')]
    """
    data = dump() if data is None else data
    entries = [e for e in (data or {}).get("entries", []) if not e.get("is_p2p")]
    last: dict[str, list[dict[str, Any]]] = {}
    for entry in reversed(entries):  # newest first: only the few kept are read in full
        kept = last.setdefault(str(entry.get("process_group")), [])
        if len(kept) < _KEPT_PER_GROUP:
            kept.append(entry)
    return [compact(entry) for kept in last.values() for entry in reversed(kept)]


def compact(entry: dict[str, Any]) -> Call:
    """One Flight Recorder entry, as the report needs it.

    Example:
        >>> compact({"collective_seq_id": 3, "profiling_name": "gloo:all_reduce",
        ...          "process_group": ["0", "default_pg"], "input_sizes": [[110]],
        ...          "input_dtypes": ["Float"], "retired": False, "frames": []})["op"]
        'all_reduce'
    """
    group = entry.get("process_group") or ["0", "default_pg"]
    frames = entry.get("frames") or []
    return {
        "seq": int(entry.get("collective_seq_id", 0)),
        "op": str(entry.get("profiling_name", "?")).split(":")[-1],
        "group": str(group[1] if len(group) > 1 and group[1] else group[0]),
        "sizes": [list(size) for size in entry.get("input_sizes", [])],
        "dtypes": [str(d) for d in entry.get("input_dtypes", [])],
        "done": bool(entry.get("retired")) or entry.get("state") == "completed",
        "where": source_line(frames),
        "purpose": purpose(frames, str(entry.get("profiling_name", ""))),
    }


def source_line(frames: list[dict[str, Any]]) -> str | None:
    """``train.py:14 (loss.backward)``-like: the innermost frame outside torch and ddpkit.

    Example:
        >>> import torch.distributed
        >>> source_line([{"name": "all_reduce", "filename": torch.distributed.__file__,
        ...               "line": 9}, {"name": "main", "filename": "/home/u/train.py",
        ...               "line": 14}])
        'train.py:14 (main)'
    """
    for frame in frames:
        filename = str(frame.get("filename", ""))
        if filename and not is_hidden(filename) and not filename.startswith("<"):
            return f"{filename.rsplit('/', 1)[-1]}:{frame.get('line')} ({frame.get('name')})"
    return None


def purpose(frames: list[dict[str, Any]], name: str) -> str | None:
    """What issued the collective, where the frames tell: DDP's gradient buckets, FSDP.

    Example:
        >>> purpose([{"name": "_engine_run_backward", "filename": "torch/autograd/graph.py"}],
        ...         "gloo:all_reduce")
        'DDP gradient bucket'
    """
    files = " ".join(str(f.get("filename", "")) for f in frames)
    names = {str(f.get("name", "")) for f in frames}
    if "fsdp" in files:
        return "FSDP gradient reduce-scatter" if "reduce_scatter" in name else "FSDP all-gather"
    if "_engine_run_backward" in names and "all_reduce" in name:
        return "DDP gradient bucket"
    return None
