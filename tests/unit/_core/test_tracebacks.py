"""Folded tracebacks: the user's frames stay, torch's and ddpkit's fold (no processes)."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ddpkit._core.tracebacks import fold_traceback, is_hidden, waiting_call


class Broken(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"bad input of shape {tuple(x.shape)}")


def caught(fn: object) -> BaseException:
    with pytest.raises(BaseException) as info:
        fn()  # type: ignore[operator]
    return info.value


def test_torch_frames_between_the_users_fold_into_one_line() -> None:
    err = caught(lambda: Broken()(torch.ones(2, 3)))
    text = fold_traceback(err, full=False)
    assert "_call_impl" not in text and "torch/nn/modules" not in text
    assert "frame(s) of torch/ddpkit hidden; DDPKIT_FULL_TRACEBACK=1 shows them" in text
    assert text.count('File "') == 3  # caught(), the lambda and Broken.forward
    assert text.endswith("ValueError: bad input of shape (2, 3)")
    assert "torch/nn/modules/module.py" in fold_traceback(err, full=True)


def test_the_call_a_rank_was_in_names_the_torch_function_and_the_users_line() -> None:
    err = caught(lambda: dist.all_reduce(torch.ones(1)))  # no process group
    call = waiting_call(err)
    assert call is not None and call.startswith("all_reduce (") and __file__ in call


def test_an_error_raised_in_the_users_own_code_has_no_call() -> None:
    assert waiting_call(caught(lambda: {}["key"])) is None


def test_a_script_that_does_not_compile_shows_pythons_caret_without_runpy(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\nx = = 1\n")
    text = fold_traceback(caught(lambda: runpy.run_path(str(script))), full=False)
    assert "<frozen runpy>" not in text
    assert text.splitlines()[-4:] == [f'  File "{script}", line 2', "    x = = 1", "        ^",
                                      "SyntaxError: invalid syntax"]  # fmt: skip


def test_chained_errors_keep_both_parts() -> None:
    def reraise() -> None:
        try:
            {}["key"]
        except KeyError as err:
            raise RuntimeError("lookup failed") from err

    text = fold_traceback(caught(reraise), full=False)
    assert "KeyError: 'key'" in text and text.endswith("RuntimeError: lookup failed")
    assert "The above exception was the direct cause of the following exception" in text


def test_multiprocessings_frames_that_start_a_warm_worker_are_not_the_users() -> None:
    import multiprocessing.process

    assert is_hidden(multiprocessing.process.__file__)
    assert not is_hidden(str(Path.cwd() / "train.py"))
