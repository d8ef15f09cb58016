"""A function worker relays its stop signal to the processes it started, as torch's killpg
reaches a fresh worker's. Each case runs in a fresh interpreter: the relay sets the
process's one signal wake-up pipe."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = """
import signal, sys, time
def stopped(signum, frame):
    print("child stopped by", signal.Signals(signum).name, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
print("child ready", flush=True)
for _ in range(600):  # short naps: a signal that lands between Python's check and a long
    time.sleep(0.05)  # sleep's start would only be handled when that sleep ends (30 s)
"""


def run(code: str, new_session: bool = True) -> list[str]:
    line = [sys.executable, "-c", textwrap.dedent(code), CHILD]
    done = subprocess.run(line, timeout=60, capture_output=True, text=True,
                          start_new_session=new_session)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_stop_signal_reaches_the_child_before_the_handler_ends_the_process() -> None:
    lines = run(
        """
        import os, signal, subprocess, sys
        from ddpkit.launch.signalrelay import relay_pending, relay_stop_signals_to_group
        os.setsid()
        print("relaying", relay_stop_signals_to_group(), flush=True)
        child = subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout.readline() == "child ready\\n"
        def leave_at_once(signum, frame):  # as ddpkit's own stop handler does
            relay_pending()
            child.wait(10)
            print(child.stdout.read().strip(), flush=True)
            os._exit(0)
        signal.signal(signal.SIGTERM, leave_at_once)
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pause()
    """,
        new_session=False,
    )
    assert lines == ["relaying True", "child stopped by SIGTERM"]


def test_a_forked_child_does_not_relay_again() -> None:
    # The fork's own stop would otherwise go round the group again, and again.
    lines = run("""
        import os, signal
        from ddpkit.launch.signalrelay import relay_stop_signals_to_group
        relay_stop_signals_to_group()
        pid = os.fork()
        if pid == 0:
            print("wake-up fd in the fork:", signal.set_wakeup_fd(-1), flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        print("wake-up fd here is set:", signal.set_wakeup_fd(-1) >= 0)
    """)
    assert lines == ["wake-up fd in the fork: -1", "wake-up fd here is set: True"]


def test_only_a_process_that_leads_its_group_relays() -> None:
    # A process in its launcher's group would signal the launcher and its own peers.
    lines = run(
        """
        from ddpkit.launch.signalrelay import relay_stop_signals_to_group
        print(relay_stop_signals_to_group())
    """,
        new_session=False,
    )
    assert lines == ["False"]


def test_a_function_worker_gets_the_signal_state_of_a_fresh_interpreter() -> None:
    """Whatever its creator left (the warm server blocks every stop signal, Python's
    forkserver ignores Ctrl-C, a server's thread may block signals), a function worker's main
    thread has none blocked, SIGINT raising KeyboardInterrupt and SIGTERM ending it; each
    ignored only where its launcher ignored it (a background job's SIGINT, nohup's SIGHUP)."""
    lines = run(
        """
        import signal
        from ddpkit.launch.warm.forkserver import STOP_SIGNALS, fresh_signal_state
        for ignored in (frozenset(), frozenset({signal.SIGINT, signal.SIGHUP})):
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # as the server has it
            fresh_signal_state(ignored)
            print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                  signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
                  signal.getsignal(signal.SIGHUP) == signal.SIG_IGN)
            try:
                signal.raise_signal(signal.SIGINT)
                print("ignored", signal.pthread_sigmask(signal.SIG_BLOCK, set()) == set())
            except KeyboardInterrupt:
                print("caught KeyboardInterrupt")
    """
    )
    assert lines == [
        "True True False",
        "caught KeyboardInterrupt",
        "True True True",
        "ignored True",
    ], lines


def test_the_warm_server_and_its_tracker_outlive_a_stop_signal_sent_to_the_whole_job() -> None:
    """SLURM's scancel signals every process of the job step: the server and Python's
    resource tracker must not end (the server's end makes torch's agent read every worker as
    failed, exit 255, before any could checkpoint; the tracker's, a traceback per lock)."""
    lines = run(
        """
        import os, signal, time
        from multiprocessing import forkserver, resource_tracker
        from ddpkit.launch.warm.forkserver import start_warm_server
        start_warm_server({})
        pids = [forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid]
        for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT):
            for pid in pids:
                os.kill(pid, sig)
        time.sleep(0.5)
        print([os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in pids])
        print(signal.pthread_sigmask(signal.SIG_BLOCK, set()) == set())  # the launcher's own
    """
    )
    assert lines == ["[True, True]", "True"], lines


def test_the_relay_thread_never_takes_a_signal_from_the_main_thread() -> None:
    """A signal sent to the process goes to a thread that does not block it: were it the
    relay's, the main thread would sleep on in its blocking call (seen under load: a
    ``signal.pause()`` that never returned). The relay thread blocks every relayed signal."""
    lines = run(
        """
        import os, signal, threading
        from ddpkit.launch.signalrelay import RELAYED, relay_stop_signals_to_group
        os.setsid()
        relay_stop_signals_to_group()
        relay = next(t for t in threading.enumerate() if t.name == "ddpkit-signal-relay")
        status = open(f"/proc/self/task/{relay.native_id}/status").read()
        mask = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
        blocked = int(mask.split()[1], 16)
        print(all(blocked >> (int(sig) - 1) & 1 for sig in RELAYED))
        print(signal.pthread_sigmask(signal.SIG_BLOCK, set()) == set())  # main: none blocked
    """,
        new_session=False,
    )
    assert lines == ["True", "True"], lines
