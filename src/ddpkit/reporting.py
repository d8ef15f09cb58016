"""Metrics a run reports for ``ddpkit bench`` (public path; see :mod:`ddpkit.observe.benchreport`).

Example:
    >>> report("epoch", epoch=1, loss=0.3, time_s=2.0, samples=1000)  # no-op outside bench
"""

from ddpkit._core.protocol import METRICS_ENV
from ddpkit.observe.benchreport import KINDS, read_reports, report

__all__ = ["KINDS", "METRICS_ENV", "read_reports", "report"]
