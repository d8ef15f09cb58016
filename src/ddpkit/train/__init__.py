"""The Trainer and its parts: step guard, precision, metrics, progress, resume, preemption,
step monitor, start-up line."""
