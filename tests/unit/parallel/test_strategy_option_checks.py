"""Every option of every strategy object refuses a value of the wrong type, or out of its
range, when the object is made: a ConfigError naming the option and the value, never a
value that reaches torch (``DDPStrategy(bucket_cap_mb="big")`` multiplied the string)."""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import types
import typing
from typing import Any

import pytest
import torch

import ddpkit
from ddpkit.faulttolerance.groups import ReplicaGroups
from ddpkit.parallel.base import STRATEGY_MODULES
from ddpkit.parallel.options import _BOUNDS, _hints


def strategy_classes() -> list[type]:
    """Every strategy class with options: the registry's, and the replica groups'."""
    paths = [path.partition(":") for path in STRATEGY_MODULES.values()]
    found = {type(getattr(importlib.import_module(module), name)) for module, _, name in paths}
    found.add(ReplicaGroups)  # options checked as a strategy's are
    return sorted((c for c in found if dataclasses.is_dataclass(c)), key=lambda c: c.__name__)


class Foreign:
    """A value of no type any option takes (its repr stable: test ids are compared between
    pytest-xdist's workers)."""

    def __repr__(self) -> str:
        return "Foreign()"


def wrong_values(hint: Any, bounds: Any) -> list[Any]:
    """Values an option of type ``hint`` within ``bounds`` must refuse."""
    if hint is Any:  # checked by the strategy itself (mixed_precision: a name or a policy)
        return [Foreign(), "fp8", 16]
    wrong: list[Any] = [Foreign()]
    args = typing.get_args(hint)
    kinds = set(args) if typing.get_origin(hint) in (typing.Union, types.UnionType) else {hint}
    if type(None) not in kinds:
        wrong.append(None)
    if bool in kinds:
        wrong += [1, "yes"]
    if int in kinds or float in kinds:
        wrong += ["big", True]
    if float in kinds:
        wrong += [math.nan, math.inf]
    if int in kinds and float not in kinds:
        wrong.append(1.5)
    if str in kinds:
        wrong.append(3)
    if any(typing.get_origin(k) is typing.Literal for k in kinds):
        wrong.append("no-such-choice")
    if any(typing.get_origin(k) is tuple for k in kinds):
        wrong += [(int,), "Block"]
    if bounds is not None and bounds.least is not None:
        wrong.append(bounds.least - 1)
    if bounds is not None and bounds.above is not None:
        wrong += [bounds.above, bounds.above - 1]
    return wrong


CASES = [
    pytest.param(cls, field.name, value, id=f"{cls.__name__}.{field.name}={value!r}"[:60])
    for cls in strategy_classes()
    for field in dataclasses.fields(cls)
    if field.init
    for value in wrong_values(_hints(cls)[field.name], field.metadata.get(_BOUNDS))
]


def test_every_option_of_every_strategy_is_walked() -> None:
    """The walk covers the options the public face pins (a new option joins it)."""
    walked = {(cls.__name__, field.name) for cls in strategy_classes()
              for field in dataclasses.fields(cls) if field.init}  # fmt: skip
    assert {("DDPStrategy", "bucket_cap_mb"), ("FSDPStrategy", "reshard_after_forward"),
            ("HSDPStrategy", "shard_size"), ("ReplicaGroups", "timeout"),
            ("FSDPStrategy", "units"), ("FSDPStrategy", "mixed_precision")} <= walked  # fmt: skip
    assert len(CASES) >= 3 * len(walked)  # a few wrong values each


@pytest.mark.parametrize(("cls", "option", "value"), CASES)
def test_a_wrong_value_is_refused_naming_the_option_and_the_value(
    cls: type, option: str, value: Any
) -> None:
    with pytest.raises(ddpkit.ConfigError) as refused:
        cls(**{option: value})
    said = str(refused.value)
    assert option in said and repr(value) in said, said


@pytest.mark.parametrize(("made", "said"), [
    (lambda: ddpkit.DDPStrategy(bucket_cap_mb=-1),
     "DDPStrategy(bucket_cap_mb=-1): bucket_cap_mb takes a number > 0 (MB a gradient bucket "
     "holds), or None; got -1"),
    (lambda: ddpkit.DDPStrategy(bucket_cap_mb="big"), "bucket_cap_mb takes a number > 0"),
    (lambda: ddpkit.DDPStrategy(static_graph=1), "static_graph takes True or False; got 1"),
    (lambda: ddpkit.HSDPStrategy(shard_size=0), "shard_size takes an integer >= 1 (ranks)"),
    (lambda: ddpkit.FSDPStrategy(units=(int,)), "units takes a tuple of nn.Module classes"),
    (lambda: ReplicaGroups(timeout=0), "timeout takes a number > 0 (seconds)"),
])  # fmt: skip
def test_the_message_says_what_the_option_takes(made: Any, said: str) -> None:
    with pytest.raises(ddpkit.ConfigError, match=re.escape(said)):
        made()


@pytest.mark.parametrize("made", [
    lambda: ddpkit.DDPStrategy(bucket_cap_mb=0.5, find_unused_parameters=True),
    lambda: ddpkit.DDPStrategy(bucket_cap_mb=25, comm_hook="bf16", broadcast_buffers=False),
    lambda: ddpkit.FSDPStrategy(units=[torch.nn.Linear], reshard_after_forward=False),
    lambda: ddpkit.HSDPStrategy(shard_size=2, mixed_precision="bf16"),
    lambda: ReplicaGroups(group="1", min_groups=2, timeout=0.5, quorum_retries=0,
                          bucket_cap_mb=4),
])  # fmt: skip
def test_good_values_are_taken(made: Any) -> None:
    made()
