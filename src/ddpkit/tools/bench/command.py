"""``ddpkit bench``: run SCRIPT at 1, 2, 4 workers; scaling table, CSV/JSON and charts.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(); add_arguments(parser)
    >>> parse(parser, ["t.py", "--workers", "1,2", "--", "--workers", "8"]).script_args
    ['--workers', '8']
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ddpkit.tools.bench.report import markdown_table, write_charts, write_results
from ddpkit.tools.bench.runner import BenchConfig, run_bench

HELP = "run SCRIPT at 1, 2, 4 workers: scaling table, CSV/JSON and charts"
DESCRIPTION = (
    "Run the unchanged SCRIPT at each world size and report training time, samples/s, "
    "speedup, efficiency and loss curves. bench's own options may come before or after "
    "SCRIPT; everything else (and all after --) goes to the script."
)


def add_arguments(bench: argparse.ArgumentParser) -> None:
    """bench's options, the script and its arguments.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parser.parse_args(["--workers", "4,1", "t.py"]).workers
        (1, 4)
    """
    _add_options(bench, None)
    bench.add_argument("script", help="the training script (reports through ddpkit.Trainer)")
    bench.add_argument("script_args", nargs=argparse.REMAINDER, help="passed to the script")


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse bench's arguments: its own options may follow SCRIPT; all after ``--`` is the
    script's.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parse(parser, ["t.py", "--repeat", "3", "--lr", "1"]).repeat
        3
    """
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    late = argparse.ArgumentParser(add_help=False)
    _add_options(late, argparse.SUPPRESS)
    found, unknown = late.parse_known_args(args.script_args)
    merged = argparse.Namespace(**{**vars(args), **vars(found)})
    merged.script_args = unknown + argv[cut + 1 :]
    return merged


def main(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table and where the files went.

    Example::

        main(parse(parser, ["examples/wine.py", "--workers", "1,2"]))
    """
    config = BenchConfig(
        script=args.script,
        script_args=tuple(args.script_args),
        workers=args.workers,
        repeat=args.repeat,
        out=Path(args.out),
        threads_per_worker=args.threads_per_worker,
    )
    summary = run_bench(config)
    written = write_results(summary, config.out)
    charts = write_charts(summary, config.out)
    print(f"\n{markdown_table(summary['rows'])}\n")
    print(
        f"batch policy: {summary['rows'][0]['batch_policy']}; "
        f"{summary['threads_per_worker']} thread(s) per worker"
    )
    for path in [*written, *(charts if isinstance(charts, list) else [])]:
        print(f"wrote {path}")
    if isinstance(charts, str):
        print(charts)
    return 0


def _add_options(parser: argparse.ArgumentParser, default: Any) -> None:
    def pick(value: Any) -> Any:
        return value if default is None else default

    parser.add_argument(
        "--workers",
        type=_sizes,
        default=pick((1, 2, 4)),
        metavar="N,N,...",
        help="world sizes to run (default: 1,2,4; 1 is a plain process, the baseline)",
    )
    parser.add_argument("--repeat", type=int, default=pick(1), help="runs per size (median)")
    parser.add_argument("--out", default=pick("bench"), help="output folder (default: bench)")
    parser.add_argument(
        "--threads-per-worker",
        type=int,
        default=pick(None),
        metavar="T",
        help="CPU threads per worker at every size (default: cores / largest size)",
    )


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list like 1,2,4") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: world sizes must be positive")
    return tuple(sorted(set(sizes)))
