"""Inside a worker: the process-group session (init/shutdown), stores, collectives, seeding,
the hang watchdog and its report, the worker's error file, bench reporting, callbacks."""
