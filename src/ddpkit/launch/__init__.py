"""The parent-process side: ``ddpkit run`` and ``ddpkit.spawn`` through torch's elastic
launcher, launch plans, the loopback rendezvous, the worker bootstrap and lifeline, and
reading worker failures; warm workers (``warm/``), the merged console (``console/``) and
several machines over ssh (``remote/``) in rooms of their own. Never joins a process group;
never imports worker-side layers."""
