"""What the launcher checks before any worker starts (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpkit.errors import ConfigError, ScriptError
from ddpkit.launch.program import Program


def test_a_script_that_compiles_passes(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import no_such_module  # fails only when run: not our business here\n")
    Program(str(script)).check()


def test_a_syntax_error_is_pythons_own_message(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("def main(:\n    pass\n")
    with pytest.raises(ScriptError) as info:
        Program(str(script)).check()
    assert str(info.value).startswith(f"{script} cannot run, so no worker was started:\n")
    assert f'File "{script}", line 1' in str(info.value) and "SyntaxError" in str(info.value)
    assert info.value.exitcode == 1


def test_a_nul_byte_is_caught_too(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(b"x = 1\x00\n")
    with pytest.raises(ScriptError, match="cannot run"):
        Program(str(script)).check()


def test_a_package_run_with_dash_m_is_checked_through_its_main_without_running_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "trainpkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('ran in the launcher')\n")
    (package / "__main__.py").write_text("print('unterminated)\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ScriptError, match=r"trainpkg/__main__.py cannot run"):
        Program("trainpkg", module=True).check()


def test_no_python_needs_an_executable_on_path() -> None:
    Program("true", no_python=True).check()
    with pytest.raises(ConfigError, match="--no-python: no-such-tool-here is not an executable"):
        Program("no-such-tool-here", no_python=True).check()
