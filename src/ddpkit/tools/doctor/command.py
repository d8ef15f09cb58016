"""``ddpkit doctor``: the environment report and preflight checks for a bug report.

It reports what this machine has (versions, backends, devices, interfaces, the distributed
variables, what ``ddpkit.init()`` would choose) and runs the tutorials' troubleshooting list
as checks, each PASS / WARN / FAIL / SKIP with the numbers and the fix. ``--smoke`` launches
an all_reduce on N ranks through the real launcher and measures its bandwidth; ``--run
SCRIPT`` trains briefly to advise on batch size, LR and GPU utilization. The exit code is 1
when a check FAILed. ``--nodes``, run on every host of a job, measures the links between the
hosts and names a slow host or link (:mod:`ddpkit.tools.doctor.links`).

Example:
    $ ddpkit doctor
    $ ddpkit doctor --smoke --json > doctor.json
    $ ddpkit doctor --master 10.0.0.1:29500 --run train.py --epochs 1
    $ ddpkit run --nnodes 3 --node-rank 0 --master 10.0.0.1:29500 -m ddpkit doctor --nodes
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ddpkit import __version__
from ddpkit._core.log import command_logger
from ddpkit._core.protocol import GRACE_PERIOD_ENV
from ddpkit._core.text import parse_endpoint
from ddpkit._core.validate import check_positive_int
from ddpkit.env.initmethod import parse_init_method
from ddpkit.errors import ConfigError
from ddpkit.launch.program import check_script
from ddpkit.tools.doctor import dumps, envinfo, links, netcheck, podcheck, preflight, probe
from ddpkit.tools.doctor.preflight import FAIL, SKIP, Check
from ddpkit.tools.doctor.smoke import size_text

HELP = "environment report and preflight checks (paste it into a bug report)"
DESCRIPTION = (
    "Report versions, backends, devices, interfaces and distributed variables, and check the "
    "launcher variables, backend, NCCL, socket interfaces, hostname, master port, FileStore "
    "and CPU threads. Exit code 1 when a check FAILs. doctor's own options go before --run; "
    "everything after SCRIPT is the script's."
)
DEFAULT_STEPS = 20
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class DoctorOptions:
    """What ``ddpkit doctor`` is asked to check beyond the machine itself.

    Example:
        >>> DoctorOptions(script="train.py").steps
        20
    """

    smoke: bool = False
    nproc: int | None = None
    master: str | None = None
    init_method: str | None = None
    script: str | None = None
    script_args: tuple[str, ...] = field(default_factory=tuple)
    steps: int = DEFAULT_STEPS
    timeout: float = DEFAULT_TIMEOUT_S
    checkpoint_dir: str | None = None
    grace_period: float | None = None
    loader_workers: int = 0


def add_arguments(doctor: argparse.ArgumentParser) -> None:
    """doctor's options; ``--run SCRIPT ...`` takes the rest of the line.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> parser.parse_args(["--run", "t.py", "--epochs", "2"]).run
        ['t.py', '--epochs', '2']
    """
    doctor.add_argument("--json", action="store_true", help="the whole report as JSON on stdout")
    doctor.add_argument("--smoke", action="store_true", help="all_reduce on N ranks: bandwidth")
    doctor.add_argument(
        "--nproc", type=_positive_int, default=None, metavar="N",
        help="workers for --smoke and --run (default: one per GPU, else 2)",
    )  # fmt: skip
    doctor.add_argument("--master", type=_endpoint, default=None, metavar="ADDR:PORT",
                        help="rank 0's endpoint (default: MASTER_ADDR/MASTER_PORT)")  # fmt: skip
    doctor.add_argument("--init-method", type=_init_method, default=None, metavar="URL",
                        help="env://, tcp://HOST:PORT or file:///PATH to check")  # fmt: skip
    doctor.add_argument("--steps", type=_positive_int, default=DEFAULT_STEPS, metavar="K",
                        help=f"optimizer steps for --run (default: {DEFAULT_STEPS})")  # fmt: skip
    doctor.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds --smoke / --run may take (default: 300)")  # fmt: skip
    doctor.add_argument("--checkpoint-dir", metavar="DIR", help="the run's checkpoint folder: "
                        "shared across pods? saves fit the grace period?")  # fmt: skip
    doctor.add_argument("--grace-period", type=float, default=None, metavar="S",
                        help="seconds between SIGTERM and SIGKILL (a pod's "
                        f"terminationGracePeriodSeconds; default: {GRACE_PERIOD_ENV})")  # fmt: skip
    doctor.add_argument(
        "--loader-workers",
        type=int,
        default=0,
        metavar="N",
        help="DataLoader workers per process, for /dev/shm's size (default 0)",
    )
    doctor.add_argument(
        "--dumps",
        type=Path,
        default=None,
        metavar="DIR",
        help="explain a job's Flight Recorder dumps (one file per rank)",
    )
    doctor.add_argument("--nodes", action="store_true",
                        help="run on every host of a job: name a slow link or host")  # fmt: skip
    doctor.add_argument("--link-mib", type=float, default=16.0, metavar="MIB",
                        help="message size for --nodes' bandwidth (default: 16)")  # fmt: skip
    doctor.add_argument("--run", nargs=argparse.REMAINDER, default=None, metavar="SCRIPT ...",
                        help="SCRIPT [ARGS]: train briefly; batch/LR, GPU use")  # fmt: skip
    # What follows `--run SCRIPT --` lands here (argparse stops --run's REMAINDER at "--").
    doctor.add_argument("after_dashes", nargs="*", help=argparse.SUPPRESS)


def options_from_args(args: argparse.Namespace) -> DoctorOptions:
    """The parsed flags as :class:`DoctorOptions`; a ConfigError for a stray argument.

    Example:
        >>> parser = argparse.ArgumentParser(); add_arguments(parser)
        >>> options_from_args(parser.parse_args(["--run", "t.py", "--", "-x"]))
        DoctorOptions(..., script='t.py', script_args=('-x',), steps=20, timeout=300.0, ...)
    """
    command = [*(args.run or []), *args.after_dashes]
    if args.run is None and command:
        raise ConfigError(f"unexpected arguments {' '.join(command)}: put SCRIPT after --run")
    if args.run is not None and not command:
        raise ConfigError("--run needs a SCRIPT (and its arguments after it)")
    if args.timeout <= 0:
        raise ConfigError(f"--timeout must be positive (got {args.timeout:g})")
    return DoctorOptions(
        smoke=args.smoke,
        nproc=args.nproc,
        master=args.master,
        init_method=args.init_method,
        script=command[0] if command else None,
        script_args=tuple(command[1:]),
        steps=args.steps,
        timeout=args.timeout,
        checkpoint_dir=args.checkpoint_dir,
        grace_period=args.grace_period,
        loader_workers=max(0, args.loader_workers),
    )


def main(args: argparse.Namespace) -> int:
    """The ``doctor`` subcommand: print the report; 1 when a check FAILed, else 0.

    Example::

        main(parser.parse_args(["--smoke"]))   # ddpkit doctor --smoke
    """
    if args.nodes:
        return _links(args)
    if args.dumps is not None:  # after the fact: no checks of this machine
        print("\n".join(dumps.explain_dumps(args.dumps)))
        return 0
    options = options_from_args(args)
    if options.script is not None:
        check_script(options.script)  # a typo is a usage error, not a failed launch
    report = build_report(options)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0 if report["ok"] else 1


def _links(args: argparse.Namespace) -> int:
    """``--nodes``, as one rank of a job: rank 0 prints what the links showed."""
    import ddpkit

    if args.link_mib <= 0:
        raise ConfigError(f"--link-mib must be positive (got {args.link_mib:g})")
    try:
        results = links.measure_links(max(4, int(args.link_mib * 2**20)))
    finally:
        ddpkit.shutdown()
    if results is not None:
        print(json.dumps(results, indent=2) if args.json else "\n".join(links.table(results)))
    return 0


def build_report(
    options: DoctorOptions, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Facts, checks, and the smoke test's and short run's results, as plain values.

    Example:
        >>> report = build_report(DoctorOptions(), {})
        >>> sorted(report), report["smoke"], report["run"]
        (['checks', 'environment', 'ok', 'run', 'smoke'], None, None)
    """
    env = os.environ if environ is None else environ
    facts = envinfo.collect(env)
    nproc = options.nproc or len(facts["gpus"]) or 2
    checks = machine_checks(options, env, facts)
    run_checks, run = _run_checks(options, len(facts["gpus"]), nproc)
    checks += run_checks
    smoke_results = None
    if options.smoke:
        _progress(f"running the smoke test on {nproc} ranks")
        smoke_check, smoke_results = probe.run_smoke(nproc, options.timeout)
        checks.append(smoke_check)
    return {
        "environment": facts,
        "checks": [asdict(check) for check in checks],
        "smoke": smoke_results,
        "run": run,
        "ok": all(check.status != FAIL for check in checks),
    }


def machine_checks(
    options: DoctorOptions, environ: Mapping[str, str], facts: Mapping[str, Any]
) -> list[Check]:
    """Checks 1-8: everything that needs no launched processes.

    Example:
        >>> [c.name for c in machine_checks(DoctorOptions(), {}, envinfo.collect({}))][:2]
        ['launcher', 'backend gloo']
    """
    backend, device = preflight.backend_choice(environ)
    names = [interface["name"] for interface in facts["interfaces"]]
    master_check, multi_node = _master_check(options, environ, facts)
    host, versions = facts["host"], facts["versions"]
    return [
        preflight.check_launcher(environ),
        preflight.check_backend(backend, device),
        preflight.check_nccl(len(facts["gpus"]), facts["backends"]["nccl"], versions["nccl"]),
        netcheck.check_socket_interfaces(environ, names),
        netcheck.check_hostname(host["hostname"], host["fqdn"], multi_node),
        master_check,
        preflight.check_file_store(options.init_method),
        preflight.check_threads(environ, options.nproc, facts["cpu"]["usable_cores"]),
        *podcheck.container_checks(
            environ,
            options.nproc,
            options.loader_workers,
            options.grace_period,
            options.checkpoint_dir,
        ),
    ]


def _master_check(
    options: DoctorOptions, environ: Mapping[str, str], facts: Mapping[str, Any]
) -> tuple[Check, bool]:
    """The master port check, and whether the endpoint suggests a multi-node job."""
    try:
        endpoint = netcheck.master_endpoint(options.master, options.init_method, environ)
    except ConfigError as err:
        fix = "export MASTER_PORT=N with 1 <= N <= 65535, or unset it"
        return Check("master port", FAIL, str(err), fix), False
    local = {i["ipv4"] for i in facts["interfaces"] if i["ipv4"]}
    addresses = netcheck.resolve(endpoint.host)
    # A master named on a non-loopback address means other nodes will join.
    off_loopback = not all(netcheck.is_loopback(a) for a in addresses)
    multi_node = endpoint.source != "default" and off_loopback
    return netcheck.check_master_port(endpoint, local), multi_node


def _run_checks(
    options: DoctorOptions, gpu_count: int, nproc: int
) -> tuple[list[Check], dict[str, Any] | None]:
    """Checks 9 and 10 from one short run of the script (SKIP without --run), and its facts."""
    if options.script is None:
        skipped = Check("batch and lr", SKIP, "needs --run SCRIPT (reads the run's set-up)")
        return [probe.check_gpu_utilization([], gpu_count, ran=False), skipped], None
    command = " ".join(["ddpkit run --nproc", str(nproc), options.script, *options.script_args])
    _progress(f"running `{command}` for up to {options.steps} optimizer steps")
    run = probe.probe_run(
        options.script, list(options.script_args), nproc, options.steps, options.timeout, gpu_count
    )
    checks = [
        probe.check_gpu_utilization(run.utilization, gpu_count, ran=True),
        probe.batch_check(run, f"`{command}`"),
    ]
    facts = {
        "command": command,
        "max_steps": options.steps,
        "returncode": run.outcome.returncode,
        "seconds": round(run.outcome.seconds, 2),
        "setup": run.setup,
        "gpu_utilization_samples": run.utilization,
    }
    return checks, facts


def _progress(message: str) -> None:
    # stderr, as every command's lines: stdout carries only the report (the JSON with --json)
    command_logger("doctor").info(f"{message} ...")


def render(report: Mapping[str, Any]) -> str:
    """The human report: a compact environment block, one line per check, the smoke table.

    Example::

        print(render(build_report(DoctorOptions(), {})))   # ddpkit doctor ...
    """
    lines = environment_lines(report["environment"])
    lines.append("")
    for check in report["checks"]:
        lines.append(Check(**check).line())
        lines += [f"      {extra}" for extra in check["detail"].splitlines()[1:]]
        if check["fix"]:
            lines.append(f"      fix: {check['fix']}")
    if report["smoke"]:
        lines += ["", *smoke_table(report["smoke"])]
    lines += ["", summary_line(report["checks"])]
    return "\n".join(lines)


def environment_lines(facts: Mapping[str, Any]) -> list[str]:
    """The environment block: one short line per fact.

    Example:
        >>> environment_lines(envinfo.collect({}))[0]
        'ddpkit doctor: ddpkit ..., python ..., torch ...'
    """
    v, b = facts["versions"], facts["backends"]
    gpus = [f"cuda:{g['index']} {g['name']} ({g['memory_gib']} GiB)" for g in facts["gpus"]]
    world = facts["world"]
    nets = [f"{i['name']} {i['ipv4'] or '-'}" for i in facts["interfaces"]]
    return [
        f"ddpkit doctor: ddpkit {__version__}, python {v['python']}, torch {v['torch']}",
        f"  cuda {v['cuda'] or '-'}, cudnn {v['cudnn'] or '-'}, nccl {v['nccl'] or '-'}; "
        + ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in b.items()),
        f"  cpu: {facts['cpu']['usable_cores']} usable core(s) of {facts['cpu']['total_cores']}"
        f"; gpus: {', '.join(gpus) or 'none'}",
        f"  host: {facts['host']['hostname']} (FQDN {facts['host']['fqdn']}); "
        f"interfaces: {', '.join(nets) or 'unknown'}",
        "  env: " + (" ".join(f"{k}={val}" for k, val in facts["env"].items()) or "(none set)"),
        f"  ddpkit.init would use: {world['describe'] or 'nothing: ' + str(world['error'])}",
    ]


def smoke_table(results: Mapping[str, Any]) -> list[str]:
    """The smoke test's bandwidth table, nccl-tests style.

    Example:
        >>> smoke_table({"world_size": 2, "backend": "gloo", "results": [{"bytes": 4096,
        ...     "time_ms": 0.25, "algbw_gbps": 0.016, "busbw_gbps": 0.016}]})[2]
        '     4 KiB     0.250 ms    0.016 GB/s    0.016 GB/s'
    """
    head = f"all_reduce on {results['world_size']} ranks ({results['backend']}):"
    lines = [head, f"{'size':>10} {'time':>12} {'algbw':>12} {'busbw':>13}"]
    for row in results["results"]:
        lines.append(
            f"{size_text(row['bytes']):>10} {row['time_ms']:>9.3f} ms "
            f"{row['algbw_gbps']:>8.3f} GB/s {row['busbw_gbps']:>8.3f} GB/s"
        )
    return lines


def summary_line(checks: list[Mapping[str, Any]]) -> str:
    """Counts by status, for the last line.

    Example:
        >>> summary_line([{"status": "PASS"}, {"status": "SKIP"}])
        '1 pass, 0 warn, 0 fail, 1 skip'
    """
    counts = {status: 0 for status in preflight.STATUSES}
    for check in checks:
        counts[check["status"]] += 1
    return ", ".join(f"{counts[s]} {s.lower()}" for s in preflight.STATUSES)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
        check_positive_int("a count", value)
    except (ValueError, ConfigError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer") from None
    return value


def _endpoint(text: str) -> str:
    try:
        parse_endpoint(text, "--master")
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _init_method(text: str) -> str:
    try:
        parse_init_method(text)
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text
