"""``examples/gpt.py``, unchanged, with the moment each rank's first optimizer step ended
written down: the job ``restart_cost.py`` times from launch to the first training step.

A global optimizer hook (torch's ``register_optimizer_step_post_hook``) writes the time to
``$FIRST_STEP_MARK.<rank>`` once; then the example runs as ``__main__`` with the arguments
given. ``DDPKIT_MAX_STEPS=1`` ends it there.

    FIRST_STEP_MARK=/tmp/mark DDPKIT_MAX_STEPS=1 torchrun --nproc-per-node 2 \\
        benchmarks/first_step_job.py
"""

import os
import runpy
import sys
import time
from pathlib import Path

from torch.optim.optimizer import register_optimizer_step_post_hook

GPT = Path(__file__).parent.parent / "examples" / "gpt.py"
marked: list[float] = []


def mark_first_step(*_: object) -> None:
    if not marked:
        marked.append(time.time())
        path = Path(f"{os.environ['FIRST_STEP_MARK']}.{os.environ.get('RANK', '0')}")
        path.write_text(repr(marked[0]))


register_optimizer_step_post_hook(mark_first_step)
sys.argv = [str(GPT), *sys.argv[1:]]
runpy.run_path(str(GPT), run_name="__main__")
