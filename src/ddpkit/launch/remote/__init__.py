"""``ddpkit run --hosts``: one job over several machines through OpenSSH, no scheduler.

The room holds the whole feature: the flags and the job they describe (``flags.py``,
``job.py``), what each host is told (``order.py``: one JSON line on the ssh session's
standard input), the one command ssh runs there (``entry.py``: ``PYTHON -m
ddpkit.launch.remote.entry``), and the sessions, their preflight and their end
(``ssh.py``). Nothing a host needs travels in ssh's command line or through a shell: no
forwarded secret shows in ``ps`` on either machine, and no host name, folder or argument
can become a shell word or one of ssh's options.
"""
