"""What an elastic job of tests/scripts/elastic_resume.py trained, attempt by attempt."""

from __future__ import annotations

from pathlib import Path


def valid_records(records: Path, same_attempt_s: float = 5.0) -> list[tuple[int, int, int]]:
    """(epoch, step, sample) trained in a step that a later attempt built on.

    Each worker's file starts ``# resumed at step S of world W at T``; files are ordered into
    attempts by T: one attempt's files share S and W and start within ``same_attempt_s`` of
    its first (more where many ranks share few cores). An attempt's steps after the step the
    next attempt resumed from were lost with it (their updates never reached a checkpoint),
    so they do not count."""
    files = []
    for path in records.glob("rank*.txt"):
        lines = path.read_text().splitlines()
        header = lines[0].split()  # "#", "resumed", "at", "step", S, "of", "world", W, "at", T
        files.append((float(header[9]), int(header[4]), int(header[7]), lines[1:]))
    files.sort()
    attempts: list[list[tuple[float, int, int, list[str]]]] = []
    for entry in files:
        first = attempts[-1][0] if attempts else None
        if first and entry[1:3] == first[1:3] and entry[0] - first[0] < same_attempt_s:
            attempts[-1].append(entry)
        else:
            attempts.append([entry])
    kept = []
    for index, attempt in enumerate(attempts):
        until = attempts[index + 1][0][1] if index + 1 < len(attempts) else None
        for _, _, _, lines in attempt:
            for line in lines:
                epoch, step, sample = map(int, line.split())
                if until is None or step <= until:
                    kept.append((epoch, step, sample))
    return kept
