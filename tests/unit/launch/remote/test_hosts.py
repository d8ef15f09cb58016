"""``ddpkit run --hosts``: the hosts read from every form other launchers write, what each
host is told, the environment it gets, and each preflight finding named with its fix."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest

from ddpkit.errors import ConfigError
from ddpkit.launch.command import add_arguments
from ddpkit.launch.remote.flags import forwarded_argv, remote_plan
from ddpkit.launch.remote.hostfile import Host, parse_hosts, read_hostfile
from ddpkit.launch.remote.job import RemotePlan, Script, ScriptKind, forwarded_environment
from ddpkit.launch.remote.order import ENTRY, HostOrder
from ddpkit.launch.remote.ssh import Ssh, _judge

HOSTFILE = """
# DeepSpeed and Open MPI
gpu01 slots=4
gpu02 slots=4 max_slots=8
gpu03:4        # MPICH
login          # --nproc's workers
node[7-8] slots=2
"""


def test_every_hostfile_form_is_read() -> None:
    assert [str(h) for h in read_hostfile(HOSTFILE)] == [
        "gpu01:4", "gpu02:4", "gpu03:4", "login", "node7:2", "node8:2",
    ]  # fmt: skip
    assert parse_hosts("a:2,me@b,c[1-2]:3") == [
        Host("a", 2),
        Host("me@b"),
        Host("c1", 3),
        Host("c2", 3),
    ]


@pytest.mark.parametrize(("text", "said"), [
    ("a slots=two", r"hostfile line 1: 'slots=two' is not understood"),
    ("a:0", r"'a:0': a host needs at least 1 worker"),
    ("a:4 slots=4", r"gives the workers twice"),
    ("a\nb\nme@a", r"names a twice: give each host once"),
    ("# nothing\n", r"hostfile names no hosts"),
])  # fmt: skip
def test_a_wrong_hostfile_line_is_named(text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        read_hostfile(text)


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = list(argv)
    return args


def test_each_host_gets_its_rank_the_meeting_point_and_the_rest_as_given() -> None:
    args = parsed("--hosts", "a:4,b", "--nproc", "2", "--max-restarts", "1", "--master-port",
                  "29600", "--env", "X=1", "t.py", "--nproc", "9")  # fmt: skip
    plan = remote_plan(args, args.argv)
    assert plan.arguments(0) == [
        "--nnodes",
        "2",
        "--node-rank",
        "0",
        "--master",
        "a:29600",
        "--nproc",
        "4",
        "--max-restarts",
        "1",
        "t.py",
        "--nproc",
        "9",
    ]
    assert plan.arguments(1)[:7] == ["--nnodes", "2", "--node-rank", "1", "--master", "a:29600",
                                     "--nproc"] and plan.arguments(1)[7] == "2"  # fmt: skip


def test_an_elastic_range_meets_at_the_first_hosts_store() -> None:
    args = parsed("--hosts", "a,b,c", "--nnodes", "2:3", "t.py")
    words = remote_plan(args, args.argv).arguments(2)
    assert words[:6] == ["--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "a:29500"]
    assert "--node-rank" not in words


@pytest.mark.parametrize(("argv", "said"), [
    (("--hosts", "a,b", "--hostfile", "h", "t.py"), "give --hosts or --hostfile, not both"),
    (("--hosts", "a,b", "--master", "x:1", "t.py"), "meet at the first host; drop --master"),
    (("--hosts", "a,b", "--nnodes", "3", "t.py"), "--nnodes 3 with 2 host"),
    (("--hosts", "a,b,c", "--nnodes", "1:2", "t.py"), "MAX at least 3"),
    (("--hostfile", "/no/such/file", "t.py"), "--hostfile /no/such/file: cannot be read"),
])  # fmt: skip
def test_flags_that_contradict_the_hosts_are_refused(argv: tuple[str, ...], said: str) -> None:
    args = parsed(*argv)
    with pytest.raises(ConfigError, match=said.replace("(", r"\(")):
        remote_plan(args, args.argv)


def test_the_environment_forwarded_then_the_env_file_then_env_flags(tmp_path: Path) -> None:
    (tmp_path / ".ddpkit_env").write_text("# for every host\nDATA=/shared/data\nSEED = 4\n")
    here = {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/src", "HOME": "/me", "SECRET": "x", "Z": "z"}
    env = forwarded_environment(["SEED=5", "Z"], here, str(tmp_path))
    assert env == {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/src", "DATA": "/shared/data",
                   "SEED": "5", "Z": "z"}  # fmt: skip
    with pytest.raises(ConfigError, match="--env NOPE: NOPE is not set here"):
        forwarded_environment(["NOPE"], here, str(tmp_path))


def test_ssh_runs_one_fixed_command_and_the_rest_travels_on_its_stdin() -> None:
    """Nothing a host is told is in ssh's command line (``ps`` shows it on both machines)
    or goes through a shell: the folder, the arguments and the environment are one JSON
    line on the session's stdin."""
    plan = RemotePlan([Host("a"), Host("me@b")], "1", 29500, ["t.py", "a b; rm -rf ~"],
                      cwd="/my runs", python="/py")  # fmt: skip
    secret = {"HF_TOKEN": "hf_planted", "MSG": "it's"}
    argv = Ssh("cfg").argv(plan.hosts[1], plan.python)
    assert argv == ["ssh", "-F", "cfg", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o",
                    "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "--", "me@b", "/py",
                    "-m", ENTRY]  # fmt: skip
    order = HostOrder.decode(plan.order(1, Script("t.py"), secret).encode())
    assert order.cwd == "/my runs" and order.env == secret
    assert order.arguments[-2:] == ["t.py", "a b; rm -rf ~"]
    assert order.probe.first == "a" and order.probe.peers == 0
    assert plan.order(0, Script("t.py"), {}).probe.peers == 1


@pytest.mark.parametrize("python", ["/opt/my python/bin/python", "python;id", "-oX", "$(id)"])
def test_a_remote_python_a_shell_would_split_is_refused(python: str) -> None:
    with pytest.raises(ConfigError, match=r"--remote-python .* give one without spaces"):
        RemotePlan([Host("a")], "1", 29500, ["t.py"], python=python)


@pytest.mark.parametrize("bad", ["-oProxyCommand=/tmp/x.sh", "a b", "a;id", "me@-x", "$(id)",
                                 "a\nb", "`id`"])  # fmt: skip
def test_a_host_ssh_could_read_as_an_option_or_a_shell_word_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="is not a host: a host is a name"):
        parse_hosts(bad)
    if not any(space in bad for space in " \n"):  # a hostfile's words are split at spaces
        with pytest.raises(ConfigError, match=r"hostfile line 1: .* is not a host"):
            read_hostfile(f"{bad} slots=2")


def test_ipv6_addresses_and_users_are_hosts() -> None:
    assert parse_hosts("[fd00::2]:4,me@[fd00::3],10.0.0.1:2") == [
        Host("fd00::2", 4), Host("me@fd00::3"), Host("10.0.0.1", 2),
    ]  # fmt: skip
    assert read_hostfile("fd00::9 slots=2") == [Host("fd00::9", 2)]
    plan = RemotePlan([Host("fd00::2"), Host("b")], "1", 29500, ["t.py"])
    assert plan.arguments(1)[4:6] == ["--master", "[fd00::2]:29500"]


def done(code: int, out: str = "", err: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess([], code, out, err)


PLAN = RemotePlan([Host("a"), Host("b")], "1", 29500, ["t.py"], cwd="/w", python="/py")
OK = (
    '"ddpkit": "{d}", "torch": "{t}", "folder": {f}, "folder_error": "No such file or '
    'directory", "script": {s}, "port_free": {p}, "reaches_first": {r}'
)


def probe(script: str = "true", port: str = "true", torch: str | None = None,
          reaches: str = "true", folder: str = "true") -> str:  # fmt: skip
    from importlib.metadata import version

    found = OK.format(d=version("ddpkit"), t=torch or version("torch"), s=script, p=port,
                      r=reaches, f=folder)  # fmt: skip
    return "ddpkit-probe {" + found + "}\n"


@pytest.mark.parametrize(("index", "result", "said"), [
    (1, done(255, err="ssh: connect to host b port 22: No route to host"),
     "host b: ssh cannot log in (ssh: connect to host b port 22: No route to host)"),
    (1, done(255, err="root@b: Permission denied (publickey)."), "ssh cannot log in (root@b"),
    (1, done(127, err="sh: 1: /py: not found"), "host b: could not run /py -m ddpkit.launch"),
    (1, done(1, err="/py: No module named ddpkit"), "the same Python with ddpkit installed"),
    (1, done(0, probe(folder="false")), "host b: the folder /w is not there (No such file"),
    (1, done(0, probe(torch="2.0.0")), "host b: torch 2.0.0 there"),
    (1, done(0, probe(script="false")), "host b: t.py does not exist there"),
    (0, done(0, probe(port="false")), "host a: port 29500 is in use there; give another with"),
    (1, done(0, probe(reaches="false")), "host b: cannot reach a:29500, where the nodes meet"),
    (0, done(0, probe(reaches="false")), ""),  # the first host listens; it reaches nothing
    (1, done(0, probe(port="false")), ""),  # only the first host's port matters
])  # fmt: skip
def test_each_preflight_finding_names_the_host_and_the_fix(
    index: int, result: subprocess.CompletedProcess[str], said: str
) -> None:
    found = _judge(PLAN, index, Script("t.py"), result)
    assert (said in found) if said else found == "", found


@pytest.mark.parametrize(("kind", "said"), [
    (ScriptKind.MODULE, "host b: t.py is not a module its Python finds there"),
    (ScriptKind.PROGRAM, "host b: t.py is not a program on the PATH there"),
])  # fmt: skip
def test_a_missing_module_or_program_is_named_as_one(kind: ScriptKind, said: str) -> None:
    assert said in _judge(PLAN, 1, Script("t.py", kind), done(0, probe(script="false")))


def test_a_double_dash_among_the_scripts_arguments_is_passed_on() -> None:
    """torch's parser drops the first ``--`` from SCRIPT's arguments (nanochat's line)."""
    argv = ["--hosts", "a,b", "-m", "scripts.base_train", "--", "--depth=20"]
    assert forwarded_argv(argv, ["scripts.base_train", "--depth=20"]) == argv[2:]
