"""The merged console's choices: which lines become one, when each goes out, in what order."""

from __future__ import annotations

import io
from pathlib import Path

from ddpkit.launch.console import LineMerger, MergedConsole, rank_ranges


def lines(merger: LineMerger, now: float, flush: bool = False) -> list[str]:
    return [group.line() for group in merger.ready(now, flush)]


def test_a_line_of_every_rank_goes_out_at_once_and_others_after_the_window() -> None:
    merger = LineMerger(window=0.5, ranks=4)
    for rank in range(4):
        merger.add(rank, "err", "FutureWarning: x", now=0.01 * rank)
    merger.add(2, "out", "rank 2 only", now=0.05)
    assert lines(merger, now=0.06) == ["[ranks 0-3] FutureWarning: x"]
    assert lines(merger, now=0.5) == []
    assert lines(merger, now=0.55) == ["[rank2] rank 2 only"]


def test_a_ranks_lines_keep_their_order_behind_a_held_line() -> None:
    merger = LineMerger(window=0.5, ranks=2)
    merger.add(0, "out", "A", now=0.0)  # waits for rank 1's A
    merger.add(0, "out", "B", now=0.1)
    merger.add(1, "out", "C", now=0.1)
    assert lines(merger, now=0.2) == []  # B waits behind A; C waits for its window
    assert lines(merger, now=0.61) == ["[rank0] A", "[rank0] B", "[rank1] C"]


def test_a_late_twin_never_reorders_a_rank() -> None:
    merger = LineMerger(window=1.0, ranks=2)
    merger.add(0, "out", "A", now=0.0)
    merger.add(1, "out", "X", now=0.0)
    merger.add(1, "out", "A", now=0.1)  # rank 1 printed X first: A of rank 0 is older
    merger.add(0, "out", "X", now=0.1)
    out = lines(merger, now=0.0, flush=True)
    assert out.index("[rank1] A") > out.index("[ranks 0-1] X") or "[rank1] A" not in out
    assert sorted(out) == sorted(["[rank0] A", "[ranks 0-1] X", "[rank1] A"])


def test_the_same_line_twice_from_one_rank_is_two_lines() -> None:
    merger = LineMerger(window=1.0, ranks=2)
    merger.add(0, "out", "tick", now=0.0)
    merger.add(0, "out", "tick", now=0.1)
    assert lines(merger, now=0.0, flush=True) == ["[rank0] tick", "[rank0] tick"]


def test_rank_ranges() -> None:
    assert rank_ranges([5]) == "5"
    assert rank_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_the_console_reads_files_as_they_grow_and_prints_what_is_left(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    files = [tmp_path / f"{rank}.out" for rank in range(2)]
    with MergedConsole(window=10.0, ranks=2, out=out, err=err) as console:
        for rank, path in enumerate(files):
            console.follow(rank, "out", path)
            path.write_text(f"same\nrank {rank}\rrank {rank} redrawn\npartial {rank}")
    assert out.getvalue().splitlines() == [
        "[ranks 0-1] same", "[rank0] rank 0 redrawn", "[rank0] partial 0",
        "[rank1] rank 1 redrawn", "[rank1] partial 1",
    ]  # fmt: skip
    assert err.getvalue() == ""
