"""``ddpkit doctor --dumps DIR``: a job's Flight Recorder dumps, explained after the fact.

torch writes one dump per rank (``TORCH_FR_DUMP_TEMP_FILE`` + rank: ``nccl_trace_rank_0``,
``..._1``; on an NCCL timeout with ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, or when a script calls
torch's dumper), whichever launcher started the job: torchrun, SLURM, ``ddpkit run``. The
files are torch's pickles (or JSON); they are read as plain data only, refusing anything
that names a class, so a dump cannot run code. The verdict is the live hang report's
(:mod:`ddpkit.flightrecorder.verdict`); ``torchfrtrace DIR`` (torch's analyzer) shows every
collective.

Example:
    >>> explain_dumps(Path("/nonexistent"))[0]
    'no Flight Recorder dumps in /nonexistent (files ending in the rank: trace_rank_0, ...)'
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

from ddpkit.flightrecorder.records import load_dump, recent_collectives
from ddpkit.flightrecorder.verdict import collective_verdict, group_name

_RANK = re.compile(r"(\d+)(\.json)?$")
_MAX_BYTES = 512 * 2**20  # a dump of 2,000 entries is a few MB; anything far larger is not one


def read_dumps(folder: Path) -> tuple[dict[int, dict[str, Any]], list[str]]:
    """``{rank: dump}`` for the files in ``folder`` named after a rank, and the files
    refused (with why).

    Example:
        >>> read_dumps(Path("/nonexistent"))
        ({}, [])
    """
    dumps: dict[int, dict[str, Any]] = {}
    refused = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        found = _RANK.search(path.name)
        if not path.is_file() or found is None:
            continue
        try:
            if path.stat().st_size > _MAX_BYTES:
                raise ValueError("too large for a Flight Recorder dump")
            dumps[int(found[1])] = load_dump(path.read_bytes())
        except (OSError, ValueError, pickle.UnpicklingError, EOFError) as err:
            refused.append(f"{path.name}: {err}")
    return dumps, refused


def explain_dumps(folder: Path) -> list[str]:
    """The report's lines: each rank's last collectives, the verdict and its fix.

    Example::

        print("\\n".join(explain_dumps(Path("/tmp/dumps"))))
    """
    dumps, refused = read_dumps(folder)
    if not dumps:
        return [f"no Flight Recorder dumps in {folder} (files ending in the rank: "
                "trace_rank_0, ...)", *(f"  refused {r}" for r in refused)]  # fmt: skip
    states = {rank: {"collectives": recent_collectives(dump)} for rank, dump in dumps.items()}
    world = max(_world_size(dump) for dump in dumps.values()) or max(dumps) + 1
    lines = [f"{len(dumps)} dump(s) of {world} rank(s) in {folder}"]
    lines += [f"  rank {rank}: {_last(state['collectives'])}" for rank, state in states.items()]
    lines += [f"  refused {reason}" for reason in refused]
    # a timed-out collective is retired with its error: the newest counts, done or not
    verdict = collective_verdict(states, world, pending_only=False)
    if verdict is None:
        lines.append("no collective was pending in these dumps: the ranks were in Python code")
    else:
        lines += [f"collectives: {verdict.line}", f"fix: {verdict.fix}"]
    lines.append(f"every collective, rank by rank: torchfrtrace {folder}")
    return lines


def _last(calls: list[dict[str, Any]]) -> str:
    if not calls:
        return "no collective recorded"
    call = max(calls, key=lambda c: c["seq"])
    state = "completed" if call["done"] else "pending"
    where = f" at {call['where']}" if call.get("where") else ""
    return f"{call['op']} #{call['seq']} of the {group_name(call['group'])} group ({state}){where}"


def _world_size(dump: dict[str, Any]) -> int:
    """The default group's size, from the dump's process-group table."""
    sizes = [0]
    for config in (dump.get("pg_config") or {}).values():
        ranks = re.findall(r"\d+", str(config.get("ranks", "")) if isinstance(config, dict) else "")
        sizes.append(len(ranks))
    return max(sizes)
