"""Precision is one choice: the loop's ``precision`` and a sharded strategy's policy agree, or
the run stops before its first step naming both."""

from __future__ import annotations

import pytest

import ddpkit
from ddpkit.errors import ConfigError
from ddpkit.train.precision import check_agrees


@pytest.mark.parametrize(
    ("loop", "policy"),
    [("fp32", "bf16"), ("bf16", "bf16"), ("bf16", None), ("fp16", None), ("fp16", "fp32")],
)
def test_one_precision_or_one_left_at_fp32_is_taken(loop: str, policy: str | None) -> None:
    check_agrees(loop, ddpkit.FSDPStrategy(mixed_precision=policy))


def test_two_different_precisions_are_refused_with_both_named() -> None:
    with pytest.raises(ConfigError, match=r'precision="fp16" and the fsdp strategy\'s '
                       r'mixed_precision="bf16" disagree'):  # fmt: skip
        check_agrees("fp16", ddpkit.FSDPStrategy(mixed_precision="bf16"))
    check_agrees("fp16", ddpkit.DDPStrategy())  # no policy: the loop's alone
