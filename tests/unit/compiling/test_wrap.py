"""prepare_model(compile=...) compiles last, and ddpkit sees through the compiled wrapper
(no processes; torch.compile is lazy, nothing is compiled until a forward pass)."""

from __future__ import annotations

import pytest
import torch

import ddpkit
from ddpkit.parallel.strategy import strategy_of, unwrap_model


def test_a_model_compiled_beforehand_is_compiled_once_after_wrapping() -> None:
    ddpkit.init()
    try:
        net = torch.nn.Linear(3, 2)
        model = ddpkit.prepare_model(torch.compile(net), strategy="none")
        assert type(model).__name__ == "OptimizedModule"
        assert type(model._orig_mod) is torch.nn.Linear  # not compiled twice
        assert unwrap_model(model) is net and strategy_of(model).name == "none"
        assert list(unwrap_model(model).state_dict()) == ["weight", "bias"]
    finally:
        ddpkit.shutdown()


def test_compile_options_must_be_a_bool_or_a_dict() -> None:
    ddpkit.init()
    try:
        with pytest.raises(ddpkit.ConfigError, match="compile must be True, False or a dict"):
            ddpkit.prepare_model(torch.nn.Linear(3, 2), compile="yes")  # type: ignore[arg-type]
    finally:
        ddpkit.shutdown()
