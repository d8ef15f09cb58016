"""SLURM host-list expansion (no processes)."""

from __future__ import annotations

import pytest

from ddpkit import ConfigError
from ddpkit.env.hostlist import expand_hostlist


@pytest.mark.parametrize(
    ("spec", "hosts"),
    [
        ("node1", ["node1"]),
        ("gpu[01-04,07]", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"]),
        ("a1,b[2-3]", ["a1", "b2", "b3"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("rack[1-2]n[1-2]", ["rack1n1", "rack1n2", "rack2n1", "rack2n2"]),
        ("x[5],y", ["x5", "y"]),
    ],
)
def test_expansion(spec: str, hosts: list[str]) -> None:
    assert expand_hostlist(spec) == hosts


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpu[01-04", "unclosed"),
        ("gpu[4-1]", "runs backwards"),
        ("gpu[a-b]", "not a number or a range"),
        ("gpu[[1]]", "nested"),
        ("", "names no hosts"),
    ],
)
def test_malformed_lists_are_named(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        expand_hostlist(spec)
