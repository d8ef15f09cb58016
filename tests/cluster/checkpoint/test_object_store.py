"""Checkpoints in an object store, against a real S3-compatible server (moto's, over HTTP).

The server is started once for this module on a loopback port and stopped at its end; ddpkit
reaches it through s3fs exactly as it would reach AWS (``AWS_ENDPOINT_URL`` and credentials
in the environment). The resume, prune, checksum and crash tests of the file-system folder
run again with ``checkpoint_dir="s3://..."``, and a 2-worker job is killed with SIGKILL and
resumed from the bucket.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import ddpkit
from ddpkit.checkpoint.background import wait_for_writes
from ddpkit.checkpoint.storage import COMMIT_SUFFIX, ObjectFolder, checkpoint_folder
from ddpkit.errors import CheckpointError
from helpers.jobs import kill_9, workers_of
from helpers.launch_helpers import REPO, SCRIPTS
from helpers.resume_helpers import Interrupted, train
from helpers.s3_server import s3_environment, s3_server

pytestmark = pytest.mark.cluster
s3fs = pytest.importorskip("s3fs", reason="the object-store tests need s3fs (make test has it)")


@pytest.fixture(scope="module")
def bucket() -> Iterator[str]:
    """A bucket on a running S3 server; the server is stopped when the module is done."""
    with s3_server() as endpoint, s3_environment(endpoint):
        s3fs.S3FileSystem().mkdir("ddpkit-test")
        yield "s3://ddpkit-test"
    assert not _server_processes(), "the S3 server outlived the tests"


@pytest.fixture
def url(bucket: str, request: pytest.FixtureRequest) -> str:
    return f"{bucket}/{request.node.name.replace('[', '-').rstrip(']')}"


def _server_processes() -> list[str]:
    found = subprocess.run(["pgrep", "-af", "moto.server"], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if "pgrep" not in line]


def names(url: str) -> list[str]:
    return checkpoint_folder(url).checkpoints()


def objects(url: str) -> list[str]:
    return sorted(Path(key).name for key in s3fs.S3FileSystem().ls(url.removeprefix("s3://")))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_a_crash_mid_epoch_resumes_from_the_bucket_to_the_same_parameters(
    tmp_path: Path, url: str, async_save: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    full, full_history = train(tmp_path / "full")
    with pytest.raises(Interrupted):
        train(url, crash_at=7, async_save=async_save)
    wait_for_writes()  # the crash left step 6's background write to complete
    newest = names(url)[-1]
    assert newest == "epoch_000002_step_000006.pt"
    capsys.readouterr()
    resumed, history = train(url, async_save=async_save)
    assert f"resumed from {url}/{newest}" in capsys.readouterr().out
    assert all(torch.equal(tensor, resumed[name]) for name, tensor in full.items())
    assert [h["loss"] for h in history] == pytest.approx([h["loss"] for h in full_history])
    assert names(url) == checkpoint_folder(tmp_path / "full").checkpoints()  # pruned alike


@pytest.mark.timeout(300)
def test_keep_last_prunes_only_older_checkpoints_markers_and_all(url: str) -> None:
    train(url, epochs=3, keep_last=2)
    assert names(url) == ["epoch_000003_step_000014.pt", "epoch_000003.pt"]
    committed = [n + COMMIT_SUFFIX for n in names(url)]
    assert objects(url) == sorted(names(url) + committed)  # nothing else left behind


@pytest.mark.timeout(300)
def test_a_damaged_newest_object_falls_back_to_the_previous_one(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    train(url, epochs=2, keep_last=None)
    previous, newest = names(url)[-2:]
    fs, key = s3fs.S3FileSystem(), f"{url.removeprefix('s3://')}/{newest}"
    data = bytearray(fs.cat(key))
    data[len(data) // 3] ^= 0x01
    fs.pipe(key, bytes(data))  # the marker stays: only the checksum can tell
    capsys.readouterr()
    _, history = train(url, epochs=3)
    out = capsys.readouterr()
    assert f"warning: skipping {url}/{newest}" in out.err and "corrupted" in out.err
    assert f"kept it as {newest}.invalid" in out.out
    assert f"resumed from {url}/{previous}" in out.out
    assert f"{newest}.invalid" in objects(url) and len(history) == 3


@pytest.mark.timeout(300)
def test_a_write_cut_short_is_never_taken_as_newest_and_is_cleaned_up(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    train(url, epochs=1)
    newest = names(url)[-1]
    fs = s3fs.S3FileSystem()
    cut_short = "epoch_000009.pt"  # an upload that ended before its commit marker
    fs.pipe(f"{url.removeprefix('s3://')}/{cut_short}", b"half a checkpoint")
    assert names(url)[-1] == newest
    capsys.readouterr()
    train(url, epochs=2)
    assert f"resumed from {url}/{newest}" in capsys.readouterr().out
    assert cut_short not in objects(url)


@pytest.mark.timeout(120)
def test_a_missing_object_reads_as_a_clear_error(url: str) -> None:
    with pytest.raises(CheckpointError, match=r"checkpoint s3://.*/epoch_000001\.pt does not"):
        ObjectFolder(url).read("epoch_000001.pt")


@pytest.mark.timeout(600)
def test_a_two_worker_job_killed_with_sigkill_resumes_from_the_bucket_bit_identical(
    tmp_path: Path, url: str
) -> None:
    """tests/scripts/async_saves.py (57 MB of state every 2 steps, written in the background)
    with its checkpoint_dir in the bucket: killed twice, then run to the end."""
    env = {**os.environ, "ASYNC_SAVES_EPOCHS": "1"}

    def start(folder: str, out: Path) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "ddpkit", "run", "--nproc", "2", "--no-merge-output",
                   str(SCRIPTS / "async_saves.py"), folder, str(out)]  # fmt: skip
        return subprocess.Popen(command, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    reference = start(str(tmp_path / "reference"), tmp_path / "reference.pt")
    output, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, output
    for kill in range(2):
        job = start(url, tmp_path / "out.pt")
        before, deadline = names(url)[-1:], time.monotonic() + 120
        while names(url)[-1:] == before and time.monotonic() < deadline:
            time.sleep(0.05)  # until a newer checkpoint reached the bucket
        time.sleep(0.1 * kill)  # then somewhere in the steps and writes after it
        workers = workers_of(job.pid)
        assert job.poll() is None and len(workers) == 2, (workers, job.communicate()[0])
        kill_9(job, workers)  # the workers too: on the launcher's SIGTERM they would save
        output, _ = job.communicate(timeout=60)
        assert kill == 0 or f"resumed from {url}/{before[0]}" in output, output
    newest = names(url)[-1]
    finish = start(url, tmp_path / "out.pt")
    output, _ = finish.communicate(timeout=300)
    assert finish.returncode == 0 and f"resumed from {url}/{newest}" in output, output
    expected = torch.load(tmp_path / "reference.pt", weights_only=True)
    final = torch.load(tmp_path / "out.pt", weights_only=True)
    assert [k for k in expected if not torch.equal(expected[k], final[k])] == []


@pytest.mark.timeout(300)
def test_the_newest_checkpoint_in_the_bucket_exports_to_one_safetensors_file(
    url: str, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    final, _ = train(url, epochs=1)
    result = ddpkit.checkpoint.export_checkpoint(url, tmp_path / "model.safetensors")
    assert result.source == f"{url}/epoch_000001.pt"
    exported = load_file(str(result.path))
    assert exported.keys() == final.keys()
    assert all(torch.equal(exported[name], tensor) for name, tensor in final.items())


@pytest.mark.timeout(300)
def test_a_compiled_run_in_the_bucket_compiles_once_for_every_node(
    url: str, tmp_path: Path
) -> None:
    """Each run on a new node (an empty TMPDIR, so no local compile cache): the first
    compiles and carries its kernels into the bucket; the resume on another node unpacks
    them and compiles nothing."""
    first = _compiled_run(url, 1, tmp_path / "node-1")
    assert first["miss"] > 0 and first["hit"] == 0, first
    assert f"{url}/compile-cache/" in first["said"] and "KB; a resume on any node" in first["said"]
    resumed = _compiled_run(url, 2, tmp_path / "node-2")
    assert resumed["hit"] > 0 and resumed["miss"] == 0, resumed
    assert f"KB from {url}/compile-cache/" in resumed["said"], resumed["said"]
    assert f"{resumed['hit']} graph(s) from the compile cache, 0 compiled" in resumed["said"]


def _compiled_run(url: str, epochs: int, node: Path) -> dict[str, object]:
    node.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "compiled_resume.py"), url, str(epochs)],
        cwd=REPO, capture_output=True, text=True, timeout=250, env={**env, "TMPDIR": str(node)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("cache "))
    said = "\n".join(x for x in done.stdout.splitlines() if "compile" in x)
    return {**json.loads(line.removeprefix("cache ")), "said": said}
