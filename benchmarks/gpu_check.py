"""The GPU check: every path only a GPU exercises, in one command that fits a short GPU window.

    make gpu-check GPU_CHECK_OUT=DIR    # PYTHONPATH=src python3 benchmarks/gpu_check.py --out DIR

Runs on a GPU machine's own Python with nothing installed (ddpkit from ``src/``; torch, pytest
and pytest-timeout from the image), in three steps, each bounded by its own time limit so that
the whole stays under 9 min 20 s on one GPU (one device command may run 10 minutes):

1. ``facts``: ``ddpkit doctor --json``: torch, CUDA, NCCL, the GPUs;
2. ``tier``: the GPU tier (``pytest -m gpu tests/gpu``): NCCL at world size 1 and doctor
   --smoke, DDP and FSDP through both faces in bf16 and fp16 (the grad scaler) with a NaN step
   skipped, ``torch.compile``, peak memory per rank, the CUDA-event step-time breakdown against
   GPU work of known length, background saves from GPU memory killed and resumed exactly,
   ``verify`` on CUDA; the 2-GPU tests skip on one GPU, with that reason;
3. ``parity``: benchmarks/gpu_parity.py: the Trainer against a hand-written DDP loop on a
   GPT-2-sized model, a ratio.

Writes DIR/summary.md (read it first), DIR/summary.json, each step's log and the tier's JUnit
XML; exits 1 when a step or a test failed. Without a CUDA GPU (or with ``--dry``) it is a dry
run that proves the wiring in under a minute: every step runs, the GPU tests report themselves
skipped with the reason, and the parity benchmark runs its tiny model on the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET  # our own pytest's JUnit file, not untrusted input
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 560  # the whole check on one GPU: the steps' limits below add up to it


@dataclass
class Step:
    """One step: its command, its time limit on a GPU, and what happened."""

    name: str
    command: list[str]
    limit_s: int
    env: dict[str, str] = field(default_factory=dict)  # set for its command
    status: str = "not run"  # passed | failed | timed out
    seconds: float = 0.0
    details: list[dict[str, str]] = field(default_factory=list)  # one row per test, or lines


def steps(out: Path, dry: bool) -> list[Step]:
    python = sys.executable
    # -v: the log names each test as it ends, so a tier cut short by its limit (no JUnit
    # file then) still shows how far it got.
    tier = [python, "-m", "pytest", "tests/gpu", "-m", "gpu", "-v", "-rA", "-p",
            "no:cacheprovider", f"--junitxml={out / 'tier.xml'}"]  # fmt: skip
    # Two runs a side: each launch of the 86M-parameter model took 20-24 s on an H100.
    parity = [
        python,
        "benchmarks/gpu_parity.py",
        "--repeat",
        "2",
        "--json",
        str(out / "parity.json"),
    ]
    # A dry run hides the GPUs, so that it stays the wiring check on a GPU machine too.
    env = {"CUDA_VISIBLE_DEVICES": ""} if dry else {}
    return [
        Step("facts", [python, "-m", "ddpkit", "doctor", "--json"], 30, env),  # 5 s on an H100
        # 257 s on one H100 (2026-11-27), 303 s on one H200 (2026-12-04, before the internals
        # test): a quarter and more over the slowest seen
        Step("tier", tier, 390, env),
        Step("parity", parity + (["--tiny", "--workers", "1"] if dry else []), 140, env),  # ~95 s
    ]


def run(step: Step, out: Path) -> None:
    """The step's command in a session of its own (a time-out stops all it started)."""
    log = out / f"{step.name}.log"
    path = os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path, **step.env}
    started = time.monotonic()
    with log.open("w") as sink:
        job = subprocess.Popen(step.command, cwd=REPO, env=env, stdout=sink,
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        try:
            code = job.wait(timeout=step.limit_s)
            step.status = "passed" if code == 0 else f"failed (exit code {code})"
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            step.status = f"timed out after {step.limit_s} s"
    step.seconds = time.monotonic() - started


def tier_rows(xml_file: Path) -> list[dict[str, str]]:
    """Each GPU test's outcome, seconds and reason, from the tier's JUnit XML."""
    if not xml_file.exists():
        return []
    rows = []
    for case in ET.parse(xml_file).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for kind in ("failure", "error", "skipped"):
            found = case.find(kind)
            if found is not None:
                outcome = {"failure": "failed", "error": "error"}.get(kind, kind)
                reason = (found.get("message") or "").splitlines()[0][:160] if found.get(
                    "message") else ""  # fmt: skip
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        rows.append({"test": test, "outcome": outcome, "seconds": case.get("time", "0"),
                     "reason": reason})  # fmt: skip
    return rows


def findings(step: Step, out: Path) -> None:
    """What a reader wants from each step's files, put on the step."""
    if step.name == "tier":
        step.details = tier_rows(out / "tier.xml")
        if any(r["outcome"] in ("failed", "error") for r in step.details):
            step.status = step.status if step.status != "passed" else "failed"
    elif step.name == "facts" and step.status == "passed":
        step.details = facts_rows((out / "facts.log").read_text())
    elif step.name == "parity":
        log = (out / "parity.log").read_text().splitlines()
        said = [line for line in log if line.startswith(("gpu_parity", "  "))]
        # a failed run's cause is in the launcher's lines, which the filter above leaves out
        step.details = [{"line": line} for line in (said if step.status == "passed" else log[-12:])]


def facts_rows(log: str) -> list[dict[str, str]]:
    try:
        facts = json.loads(log[log.index("{") :])
    except ValueError:
        return [{"line": "doctor --json gave no JSON (see facts.log)"}]
    environment = facts.get("environment", {})
    versions = environment.get("versions", {})
    gpus = ", ".join(f"{g.get('name')} ({g.get('memory_gib')} GiB)"
                     for g in environment.get("gpus", []))  # fmt: skip
    keys = ("python", "torch", "cuda", "nccl")
    return [{"line": ", ".join(f"{k} {versions.get(k) or '-'}" for k in keys)},
            {"line": f"GPUs: {gpus or 'none'}"}]  # fmt: skip


def summary(all_steps: list[Step], dry: bool, total_s: float) -> str:
    mode = ("DRY RUN (no CUDA GPU): the wiring only; GPU tests skip with their reason"
            if dry else "on the GPU")  # fmt: skip
    took = f"{total_s:.0f} s in all (the steps' limits add up to {BUDGET_S} s)"
    lines = [f"# ddpkit gpu-check: {verdict(all_steps)}", "", f"{mode}; {took}", ""]
    for step in all_steps:
        lines += [f"## {step.name}: {step.status} ({step.seconds:.0f} s of {step.limit_s} s)", ""]
        for row in step.details:
            if "test" in row:
                reason = f" ({row['reason']})" if row["reason"] else ""
                lines.append(f"- {row['outcome']:7} {float(row['seconds']):6.1f} s  "
                             f"{row['test']}{reason}")  # fmt: skip
            else:
                lines.append(f"    {row['line']}")
        lines.append("")
    return "\n".join(lines)


def verdict(all_steps: list[Step]) -> str:
    return "PASS" if all(s.status == "passed" for s in all_steps) else "FAIL"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for the summary and the logs")
    parser.add_argument(
        "--dry", action="store_true", help="the wiring only (default without a GPU)"
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    dry = args.dry or not cuda_available()
    started, all_steps = time.monotonic(), steps(out, dry)
    for step in all_steps:
        print(f"gpu-check: {step.name} (at most {step.limit_s} s)...", flush=True)
        run(step, out)
        findings(step, out)
        print(f"gpu-check: {step.name} {step.status} in {step.seconds:.0f} s", flush=True)
    text = summary(all_steps, dry, time.monotonic() - started)
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"dry": dry, "verdict": verdict(all_steps),
                                                  "steps": [asdict(s) for s in all_steps]},
                                                 indent=1))  # fmt: skip
    print(text, flush=True)
    return 0 if verdict(all_steps) == "PASS" else 1


def cuda_available() -> bool:
    import torch  # after the arguments: --help answers without it

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
