"""TrainLoop against the hand-written DDP loop, in the same workers, step after step.

``parity.py`` launches each variant afresh, and on this shared 2-core machine one launch
differs from the next by several percent (the same loop, launched twice, has read 0.95 and
1.05): far more than a loop's own cost. Epochs of each in turn (this benchmark until
2026-11-29) still differed by 3-4% between two runs: the machine's load changes within
seconds. Here 2 workers train the parity workload's DDP model both ways, one step of each
in turn inside every epoch:

- ``hand``: the tutorials' loop: a ``DataLoader`` over a ``DistributedSampler``,
  ``set_epoch``, ``zero_grad``, forward, ``loss.backward()``, ``optimizer.step()``;
- ``loop``: ``ddpkit.TrainLoop`` over ``prepare_loader``'s loader (``backward``,
  ``optimizer_step``): one loop for the run, as a script has.

Each way fetches its next batch at the end of its step, as a ``for`` loop does, and the
two take turns strictly (hand, loop, hand, loop...): each way's fetch then follows its own
step, its code as cold as in a run of its own. (Until 2026-11-29 the order alternated step
by step: half the hand's fetches then ran right after the loop's fetch of the same code,
with its caches warm: 270 us a fetch against the loop's 360, 1.3% of an MLP step.)
A hand step is timed from its update to its next batch; the loop's time is the rest of the
wall time, so it counts everything the loop does, its epoch's end (the epoch line's
collective) included. It prints, per workload, the median of the rounds' ratios (loop /
hand, each round one epoch of each) and each one's mean step time. ``--same`` runs the
hand-written loop both ways, with no TrainLoop: how far the ratio strays when nothing
differs, on this machine, that day (an A/A run).

    .venv/bin/python benchmarks/loop_parity.py --rounds 8      # about 2 minutes
    .venv/bin/python benchmarks/loop_parity.py --workloads gpt2 --rounds 6 --with-aa

``gpt2`` is a Hugging Face workload (the ``hf`` extra): transformers' ``GPT2LMHeadModel`` at a
small config (2 layers, 64 wide, 256 byte tokens, 32 positions, 8 a batch), dict batches as a
tokenizer's collate gives them (``input_ids``, ``attention_mask``, ``labels``), AdamW.
``--with-aa`` runs each workload's A/A run right after its own, so a ratio is read against that
day's spread.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from parity import make_data, make_model
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

import ddpkit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from gpt import GPT, GPTConfig, load_text  # examples/ is no package

Ratios = dict[str, list[float]]
LossOf = Callable[[Any, Any], torch.Tensor]  # (model, batch) -> the step's loss
BATCH = {"cnn": 64, "mlp": 64, "gpt": 16, "gpt2": 8}  # samples per worker per step, unless --batch


def classify(model: Any, batch: Any) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs), targets)


def language_model(model: Any, batch: Any) -> torch.Tensor:
    return model(**batch).loss  # Hugging Face's way: a dict of token ids in, .loss out


def workload(name: str, samples: int | None) -> tuple[torch.nn.Module, Dataset, LossOf, Any]:
    """The model, its data, its loss and its optimizer (given the parameters): ``cnn`` and
    ``mlp`` are parity.py's (SGD, ``samples`` of them, 2048 unless given); ``gpt`` is
    examples/gpt.py's (byte-level, 3 blocks, dict batches of argparse.py's source, AdamW)
    and ``gpt2`` Hugging Face's, on the first ``samples`` windows of that source (all of
    them unless given)."""
    adamw = functools.partial(torch.optim.AdamW, lr=1e-3)
    torch.manual_seed(0)
    if name in ("cnn", "mlp"):
        sgd = functools.partial(torch.optim.SGD, lr=0.01)
        return make_model(name), make_data(name, samples or 2048), classify, sgd
    if name == "gpt2":
        model: torch.nn.Module = hugging_face_gpt2()
        text: Dataset = TokenWindows(load_text(GPT2_POSITIONS)[0])
    else:
        config = GPTConfig()
        model, text = GPT(config), load_text(config.block_size)[0]
    windows = range(min(samples, len(text)) if samples else len(text))  # type: ignore[arg-type]
    return model, Subset(text, windows), language_model, adamw


GPT2_POSITIONS = 32


def hugging_face_gpt2() -> torch.nn.Module:
    """transformers' GPT2LMHeadModel at a small config (byte tokens), as users load one."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as err:
        raise SystemExit("the gpt2 workload needs transformers: pip install -e '.[hf]'") from err
    config = GPT2Config(vocab_size=256, n_positions=GPT2_POSITIONS, n_embd=64, n_layer=2,
                        n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config)


class TokenWindows(Dataset):
    """A tokenizer's collate as Hugging Face gives it: ``input_ids``, ``attention_mask`` and
    ``labels`` (the ids again: the model shifts them itself)."""

    def __init__(self, windows: Dataset) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self.windows[index]["input_ids"]
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


class HandSteps:
    """The tutorials' loop, one step at a time, each step's time added to :attr:`seconds`.

    Its ``zero_grad`` comes after the update, as the loop's does: the other way's step then
    finds no gradient to add to (one the tutorials' order left would make its backward an
    accumulation, 0.5 ms more a step on the MLP: measured so until 2026-11-29's fix).
    """

    def __init__(self, model: Any, optimizer: Any, loader: DataLoader, loss_of: LossOf) -> None:
        self.loader, self.model, self.optimizer = loader, model, optimizer
        self.loss_of = loss_of
        self.seconds, self._batches, self._next = 0.0, iter(()), None

    def step(self, batch: Any) -> None:
        self.loss_of(self.model, batch).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def start_epoch(self, epoch: int) -> None:
        start = time.perf_counter()
        self.loader.sampler.set_epoch(epoch)  # type: ignore[union-attr]
        self._batches = iter(self.loader)
        self._next = next(self._batches)
        self.seconds += time.perf_counter() - start

    def __call__(self) -> None:
        """One step on the batch fetched last, then the next batch (None: the epoch ends)."""
        start = time.perf_counter()
        self.step(self._next)
        self._next = next(self._batches, None)
        self.seconds += time.perf_counter() - start


def loop_rounds(cfg: dict[str, Any], model: Any, optimizer: Any, hand: HandSteps) -> Ratios:
    """TrainLoop's epochs, a hand step beside each of its steps; round 0 warms up."""
    loader = ddpkit.prepare_loader(hand.loader.dataset, cfg["batch"])
    assert len(loader) == len(hand.loader)
    loop = ddpkit.TrainLoop({"model": model, "optimizer": optimizer})
    times: Ratios = {"hand": [], "loop": []}
    began = None
    for round_ in loop.epochs(cfg["rounds"] + 2):  # the last ends with the run's end: not kept
        now = time.perf_counter()
        if began is not None and round_ > 1:
            times["loop"].append(now - began - hand.seconds)
            times["hand"].append(hand.seconds)
        began, hand.seconds = now, 0.0
        hand.start_epoch(round_)
        for batch in loop.batches(loader):
            hand()
            loop.backward(hand.loss_of(model, batch))
            loop.optimizer_step(optimizer)
    return times


def same_rounds(cfg: dict[str, Any], model: Any, optimizer: Any, hand: HandSteps) -> Ratios:
    """The A/A run: two hand-written loops over loaders of their own, step by step."""
    data = hand.loader.dataset
    other = HandSteps(model, optimizer, DataLoader(data, cfg["batch"], sampler=shard(data)),
                      hand.loss_of)  # fmt: skip
    times: Ratios = {"hand": [], "loop": []}
    for round_ in range(cfg["rounds"] + 1):
        hand.seconds = other.seconds = 0.0
        hand.start_epoch(round_)
        other.start_epoch(round_)
        for _ in range(len(hand.loader)):
            hand()
            other()
        if round_:
            times["hand"].append(hand.seconds)
            times["loop"].append(other.seconds)
    return times


def shard(data: Any) -> DistributedSampler:
    """The tutorials' sampler; the world given, as a world of one has no process group."""
    world = ddpkit.current_world()
    return DistributedSampler(data, num_replicas=world.world_size, rank=world.rank)


def worker(cfg: dict[str, Any]) -> Ratios:
    torch.set_num_threads(cfg["threads"])
    ddpkit.init()
    module, data, loss_of, make_optimizer = workload(cfg["workload"], cfg["samples"])
    model = ddpkit.prepare_model(module)
    optimizer = make_optimizer(model.parameters())
    loader = DataLoader(data, cfg["batch"], sampler=shard(data))
    hand = HandSteps(model, optimizer, loader, loss_of)
    rounds: Callable[..., Ratios] = same_rounds if cfg["same"] else loop_rounds
    times = rounds(cfg, model, optimizer, hand)
    ddpkit.shutdown()
    return {**times, "steps": [float(len(hand.loader))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="epochs of each, alternating")
    parser.add_argument("--workloads", default="cnn,mlp,gpt")
    parser.add_argument("--workers", type=int, default=2,
                        help="1: the loops' own costs, no gradient all-reduce")  # fmt: skip
    parser.add_argument("--batch", type=int, help=f"samples per worker per step ({BATCH})")
    parser.add_argument(
        "--samples", type=int, help="per round: cnn and mlp 2048, gpt and gpt2 all of their text"
    )
    parser.add_argument("--same", action="store_true",
                        help="the hand-written loop both ways: the ratio's spread when nothing "
                        "differs (an A/A run)")  # fmt: skip
    parser.add_argument("--with-aa", action="store_true",
                        help="each workload's A/A run (--same) after it")  # fmt: skip
    args = parser.parse_args()
    print(f"{args.workers} workers x 1 thread, {args.rounds} rounds of an epoch each way, a "
          "step of each in turn in the same workers")  # fmt: skip
    for name in args.workloads.split(","):
        kinds = [args.same, True] if args.with_aa and not args.same else [args.same]
        for same in kinds:
            cfg = {"workload": name, "threads": 1, "rounds": args.rounds, "same": same,
                   "batch": args.batch or BATCH[name], "samples": args.samples}  # fmt: skip
            report(name, cfg, ddpkit.spawn(worker, args.workers, cfg)[0])


def report(name: str, cfg: dict[str, Any], times: Ratios) -> None:
    """One line: the median of the rounds' ratios, their range, each way's step time."""
    hand, loop = times["hand"], times["loop"]
    ratios = [mine / theirs for mine, theirs in zip(loop, hand, strict=True)]
    steps = times["steps"][0]
    what = "A/A: hand-written / hand-written" if cfg["same"] else "TrainLoop / hand-written"
    print(f"{name} (batch {cfg['batch']}): {what}, median of the rounds' ratios "
          f"{statistics.median(ratios):.3f} (lowest {min(ratios):.3f}, highest "
          f"{max(ratios):.3f}); hand {statistics.mean(hand) / steps * 1e3:.2f} ms/step, "
          f"other {statistics.mean(loop) / steps * 1e3:.2f} ms/step")  # fmt: skip


if __name__ == "__main__":
    main()
