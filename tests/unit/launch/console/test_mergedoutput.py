"""The merged console's choices: which lines become one, when each goes out, in what order,
and the line a rank is still drawing, shown live."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

from ddpkit.launch.console.linemerge import LineMerger, rank_ranges
from ddpkit.launch.console.liveline import LiveLine
from ddpkit.launch.console.mergedoutput import FollowedFile, MergedConsole


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


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_the_console_prints_lines_while_the_files_grow_and_what_is_left_at_exit(
    tmp_path: Path,
) -> None:
    out, err = io.StringIO(), io.StringIO()
    files = [tmp_path / f"{rank}.out" for rank in range(2)]
    with MergedConsole(window=0.2, ranks=2, out=out, err=err) as console:
        for rank, path in enumerate(files):
            console.follow(rank, "out", path)
        with files[0].open("a") as rank0:
            rank0.write("first\n")
            rank0.flush()
            # out while the worker runs (a console that reads at exit never gets here)
            assert wait_for(lambda: "[rank0] first\n" in out.getvalue()), out.getvalue()
            rank0.write("partial 0")
        files[1].write_text("first\nsecond\n")
        assert wait_for(lambda: "[rank1] second\n" in out.getvalue()), out.getvalue()
    shown = [line.rsplit("\r", 1)[-1] for line in out.getvalue().split("\n")]  # as drawn
    assert shown == [
        "[rank0] first", "[rank1] first", "[rank1] second", "[rank0] partial 0", "",
    ]  # fmt: skip
    assert err.getvalue() == ""


def test_a_line_being_redrawn_is_shown_live_with_its_rank_then_printed_whole(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    path = tmp_path / "0.out"
    with MergedConsole(window=0.2, ranks=2, out=out) as console:
        console.live.interval = 0.0
        console.follow(0, "out", path)
        with path.open("a") as rank0:
            rank0.write("\rbar  10%\rbar  20%")
            rank0.flush()
            # the newest state once found whole (unchanged over a poll), while it runs
            assert wait_for(lambda: out.getvalue().endswith("\r[rank0] bar  20%")), out.getvalue()
            rank0.write("\rbar 100%\n")
    assert out.getvalue().endswith("\r[rank0] bar 100%\n"), repr(out.getvalue())


def test_a_ranks_bar_waits_behind_its_own_held_line(tmp_path: Path) -> None:
    out = io.StringIO()
    path = tmp_path / "0.out"
    path.write_text("held for its twin\n\rbar 50%")
    with MergedConsole(window=0.5, ranks=2, out=out) as console:
        console.live.interval = 0.0
        console.follow(0, "out", path)
        assert wait_for(lambda: "bar 50%" in out.getvalue(), timeout=2.0)
    text = out.getvalue()
    assert text.index("[rank0] held for its twin") < text.index("[rank0] bar 50%"), text


def test_the_newest_whole_state_of_a_line_in_progress(tmp_path: Path) -> None:
    path = tmp_path / "stdout.log"
    followed = FollowedFile(path)
    assert followed.new_lines() == [] and followed.live is None  # no file yet
    path.write_text("done\n\r 10%\r 2")
    assert followed.new_lines() == ["done"] and followed.live == " 10%"  # " 2": half written
    assert followed.new_lines() == [] and followed.live == " 2"  # unchanged over a poll: whole
    with path.open("a") as file:
        file.write("0%\r" + " " * 8 + "\r")  # tqdm's leave=False clears its line
    assert followed.new_lines() == [] and followed.live == ""
    with path.open("a") as file:
        file.write("loss 0.5\n")
    assert followed.new_lines() == ["loss 0.5"] and followed.live is None


def test_a_live_line_in_a_terminal_is_redrawn_in_place_and_under_printed_lines() -> None:
    out = io.StringIO()
    live = LiveLine(out, terminal=True, interval=0.1)
    live.show("[rank0] 10%", now=0.0)
    live.show("[rank0] 20%", now=0.05)  # too soon: held back
    live.show("[rank0] 20%", now=0.1)
    live.clear()
    out.write("[rank1] a line\n")
    live.show("[rank0] 20%", now=0.11)  # back at once under the printed line
    assert out.getvalue() == (
        "\r\x1b[K[rank0] 10%\r\x1b[K[rank0] 20%\r\x1b[K[rank1] a line\n\r\x1b[K[rank0] 20%"
    )


def test_a_live_line_in_a_pipe_is_rewritten_padded_and_not_repeated() -> None:
    out = io.StringIO()
    live = LiveLine(out, terminal=False, interval=0.5)
    live.show("[rank0] 100 steps", now=0.0)
    live.show("[rank0] 1 step", now=0.5)
    live.clear()
    out.write("[rank1] a line\n")
    live.show("[rank0] 1 step", now=2.0)  # the same state: a log does not repeat it
    live.show("[rank0] 2 steps", now=2.1)  # a new one on a cleared line: at once
    assert out.getvalue().split("\r") == [
        "", "[rank0] 100 steps", "[rank0] 1 step   ", " " * 17, "[rank1] a line\n",
        "[rank0] 2 steps",
    ]  # fmt: skip
