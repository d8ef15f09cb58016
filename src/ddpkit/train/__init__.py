"""The training engine: the loop both faces share (``loop``, ``trainer``), and what a step
passes through (step guard, precision, the update, progress and resume, preemption, the step
monitor, the run's set-up). What watches a run lives in ``ddpkit.observe``."""
