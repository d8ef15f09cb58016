"""Each way a script can end, run by ``ddpkit run --run-path [--start-method M]``: MODE is

- ``return``, ``sys_exit``, ``sys_exit0``, ``os_exit0``, ``step_limit``: a success;
  ``os_exit0_thread``: a success too, ``os._exit(0)`` called by a thread while the main
  thread sleeps (it says so if it ever wakes: the process should have ended);
  ``caught_sigint``: a SIGINT (Ctrl-C's signal) caught as KeyboardInterrupt, then a
  normal ending;
- ``sys_exit3``, ``raise``: a failure on rank 1;
- ``state``: each rank prints what a fresh interpreter would have (``state rank=...``);
- ``dataloader``: two DataLoader worker processes (forked by the script) read a dataset;
- ``exit_handlers``: a non-daemon thread, a thread pool left open and an ``atexit`` handler,
  each printing when it runs; ``stdin``: rank 0 prints the line it reads from stdin;
- ``child_stop REPORT``: rank 0 starts a child process that writes to REPORT when it
  starts and when a signal stops it; rank 1 then fails, and torch's agent stops rank 0;
- ``child_waits REPORT``: rank 0 starts such a child, then both ranks wait (a minute) for
  the launcher to be stopped by a signal, which torch's agent passes on to them;
- ``cuda``: whether CUDA was initialised before the script (never, by a warm server), then
  an all-reduce on the GPU (the GPU tier).

Each rank first meets the other in an all-reduce, so a rank that ends wrongly shows.
"""

import atexit
import concurrent.futures
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import torch
import torch.distributed as dist

import ddpkit

MODE = sys.argv[1]


def main() -> None:
    if MODE == "cuda":
        print(f"cuda initialised before the script: {torch.cuda.is_initialized()}", flush=True)
    world = ddpkit.init(timeout=60)
    dist.all_reduce(torch.ones(1, device=world.device))
    if MODE == "state":
        print(f"state rank={world.rank} threads={torch.get_num_threads()} "
              f"numpy={np.random.randint(1 << 30)} mp={multiprocessing.get_start_method()} "
              f"main={__name__} session={os.getsid(0) == os.getpid()} "
              f"argv={sys.argv[1:]}", flush=True)  # fmt: skip
        with open("/proc/self/cmdline", "rb") as cmdline:  # what ps and pkill -f read
            shown = cmdline.read().rstrip(b"\0").replace(b"\0", b" ").decode()
        print(f"cmdline rank={world.rank}: {shown}", flush=True)
        with open("/proc/self/environ", "rb") as environ:  # what tools read a rank from
            ranked = f"RANK={world.rank}".encode() in environ.read().split(b"\0")
        print(f"environ rank={world.rank}: {ranked}", flush=True)
    if MODE == "exit_handlers":
        leave_work_behind(world.rank)
    if MODE == "dataloader":
        data = torch.utils.data.TensorDataset(torch.arange(16.0))
        loaded = [b for (b,) in torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)]
        print(f"rank {world.rank} loaded {len(loaded)} batches", flush=True)
    if MODE == "stdin" and world.rank == 0:
        print(f"read from stdin: {sys.stdin.readline().strip()!r}", flush=True)
    if MODE == "sys_exit":
        sys.exit()
    if MODE == "sys_exit0":
        sys.exit(0)
    if MODE == "os_exit0":
        print(f"rank {world.rank} leaving by os._exit(0)", flush=True)
        os._exit(0)
    if MODE == "os_exit0_thread":
        leaving = threading.Thread(target=os._exit, args=(0,), name="leaver")
        print(f"rank {world.rank} leaving by os._exit(0) on a thread", flush=True)
        leaving.start()
        time.sleep(20)
        print(f"rank {world.rank}: the main thread woke; os._exit(0) ended nothing", flush=True)
    if MODE == "caught_sigint":
        try:
            signal.raise_signal(signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            print(f"rank {world.rank} caught KeyboardInterrupt", flush=True)
    if MODE == "child_stop":
        start_a_child_then_fail(world.rank, sys.argv[2])
    if MODE == "child_waits":
        start_a_child_then_wait(world.rank, sys.argv[2])
    if MODE == "sys_exit3" and world.rank == 1:
        sys.exit(3)
    if MODE == "raise" and world.rank == 1:
        raise ValueError("a bad batch on rank 1")
    if MODE == "step_limit":  # ddpkit's own stop: every rank leaves by os._exit(0)
        model = ddpkit.prepare_model(torch.nn.Linear(2, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        loop = ddpkit.TrainLoop({"model": model, "optimizer": optimizer})
        data = torch.utils.data.TensorDataset(torch.randn(32, 2))
        for _ in loop.epochs(2):
            for (x,) in loop.batches(ddpkit.prepare_loader(data, batch_size=4)):
                loop.backward(model(x).sum())
                loop.optimizer_step()
        print("after the loop: never", flush=True)


CHILD = """
import signal, sys, time
def stopped(signum, frame):
    with open(sys.argv[1], "a") as report:
        report.write(f"child stopped by {signal.Signals(signum).name}\\n")
    sys.exit(0)
for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1"):
    signal.signal(getattr(signal, name), stopped)
with open(sys.argv[1], "a") as report:
    report.write("child started\\n")
for _ in range(1200):  # short naps: a signal that lands between Python's check and a long
    time.sleep(0.05)  # sleep's start would only be handled when that sleep ends (60 s)
"""


def start_a_child(rank: int, report: str) -> None:
    """Rank 0 starts a child (its handlers set before the peers go on); every rank meets."""
    if rank == 0:
        subprocess.Popen([sys.executable, "-c", CHILD, report])
        while not (os.path.exists(report) and os.path.getsize(report)):
            time.sleep(0.05)
    dist.barrier()


def start_a_child_then_fail(rank: int, report: str) -> None:
    """Rank 0 starts a child; rank 1 then fails, and torch's agent stops rank 0."""
    start_a_child(rank, report)
    if rank == 1:
        raise ValueError("rank 1 fails, and torch's agent stops rank 0")
    time.sleep(60)


def start_a_child_then_wait(rank: int, report: str) -> None:
    """Rank 0 starts a child; both ranks wait for the launcher's stop signal."""
    start_a_child(rank, report)
    time.sleep(60)


def leave_work_behind(rank: int) -> None:
    """What Python finishes after the script: its threads, its pools, its exit handlers."""

    def late(what: str) -> None:
        time.sleep(0.5)
        # One write with its newline: print writes the text and the newline apart, and the
        # two threads' lines, due at the same moment, then ran into each other once.
        sys.stdout.write(f"{what} done on rank {rank}\n")
        sys.stdout.flush()

    threading.Thread(target=late, args=("thread",)).start()
    concurrent.futures.ThreadPoolExecutor(1).submit(late, "pool task")  # never shut down
    atexit.register(print, f"atexit handler on rank {rank}", flush=True)


if __name__ == "__main__":
    main()
