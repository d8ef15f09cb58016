"""Profiling a window of steps on every rank: which window (:mod:`.spec`), each rank's part
and rank 0's merge (:mod:`.profiler`), the ranks' clocks against rank 0's (:mod:`.clocksync`),
the Chrome traces made one timeline (:mod:`.chrometrace`), and what each rank did
(:mod:`.summary`). ``ddpkit run --profile`` and ``profile=`` on both faces start it.
"""
