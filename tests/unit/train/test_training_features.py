"""Training features in a world of one (no processes): the same code path N workers run."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import ddpkit
from ddpkit import ConfigError
from ddpkit.checkpoint import Position
from ddpkit.checkpoint.sharded import (
    SafeFileSystemReader,
    load_sharded,
    read_sharded_extra,
    save_sharded,
)
from ddpkit.errors import CheckpointError
from ddpkit.runtime.seeding import rank_seed
from ddpkit.train.steps import MetricSums, classifier_metrics
from helpers.mp_workers import toy_dataset, toy_model


def test_dp_without_two_gpus_says_so_and_runs_unwrapped(capsys: pytest.CaptureFixture) -> None:
    ddpkit.init()
    model = ddpkit.prepare_model(toy_model(), "dp")
    assert isinstance(model, torch.nn.Sequential)
    assert 'strategy="dp" needs 2 or more GPUs and 0 is visible' in capsys.readouterr().out


def test_fsdp_in_a_world_of_one_trains_the_whole_model() -> None:
    ddpkit.init()
    model = ddpkit.prepare_model(toy_model(), ddpkit.FSDPStrategy(units=(torch.nn.Linear,)))
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
    history = trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=8), epochs=2)
    assert history[1]["loss"] < history[0]["loss"]


@pytest.mark.parametrize(
    ("strategy", "options", "message"),
    [
        ("DDPStrategy", {"comm_hook": "int8"}, "comm_hook takes one of 'fp16', 'bf16', 'powers"),
        ("FSDPStrategy", {"bucket_cap_mb": 5}, r"no option 'bucket_cap_mb' \(DDPStrategy has\)"),
        ("DDPStrategy", {"units": (torch.nn.Linear,)}, r"no option 'units' \(FSDPStrategy and"),
        ("FSDPStrategy", {"units": ("Linear",)}, "units takes a tuple of nn.Module classes"),
        ("HSDPStrategy", {"units": torch.nn.Linear}, r"units takes a tuple of nn.Module classes"),
    ],
)
def test_wrong_strategy_options_are_refused(strategy: str, options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        getattr(ddpkit, strategy)(**options)


def test_fp16_needs_a_gpu_and_unknown_precisions_are_listed() -> None:
    ddpkit.init()
    model = ddpkit.prepare_model(toy_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match=r'needs a CUDA device.*Use precision="bf16" on CPU'):
        ddpkit.Trainer(model, opt, F.cross_entropy, precision="fp16")
    with pytest.raises(ConfigError, match="unknown precision 'fp8'; choose one of 'fp32'"):
        ddpkit.Trainer(model, opt, F.cross_entropy, precision="fp8")


def test_bf16_autocast_runs_the_forward_in_bf16_and_keeps_fp32_weights() -> None:
    ddpkit.init()
    model = ddpkit.prepare_model(toy_model())
    trainer = ddpkit.Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, precision="bf16"
    )
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    history = trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=8), epochs=3)
    assert seen[0] == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert history[2]["loss"] < history[0]["loss"]


def test_lr_scaling_rules() -> None:
    ddpkit.init()
    linear = ddpkit.plan_batch(32, accumulate=4, lr=0.1, lr_scaling="linear")
    root = ddpkit.plan_batch(32, accumulate=4, lr=0.1, lr_scaling="sqrt")
    assert (linear.global_batch, linear.lr) == (128, pytest.approx(0.4))
    assert root.lr == pytest.approx(0.2)
    assert ddpkit.plan_batch(32, "global", lr=0.1, lr_scaling="none").lr == 0.1
    with pytest.raises(ConfigError, match="unknown lr_scaling 'cubic'"):
        ddpkit.plan_batch(32, lr=0.1, lr_scaling="cubic")
    with pytest.raises(ConfigError, match="unknown uneven 'wrap'; choose one of 'pad', 'drop'"):
        ddpkit.prepare_loader(toy_dataset(), 8, uneven="wrap")


def test_the_scheduler_is_stepped_per_step_and_resumed_from_the_checkpoint(
    tmp_path: Path,
) -> None:
    def trainer_with_scheduler(epochs: int) -> ddpkit.Trainer:
        model = ddpkit.prepare_model(toy_model())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
        trainer = ddpkit.Trainer(model, opt, F.cross_entropy, tmp_path, scheduler=scheduler)
        trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=8), epochs=epochs)
        return trainer

    ddpkit.init()
    first = trainer_with_scheduler(epochs=2)  # 5 steps per epoch: 10 steps
    assert first.schedulers["scheduler"].last_epoch == 10
    assert first.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**3)
    resumed = trainer_with_scheduler(epochs=3)  # resumes at epoch 2, 5 more steps
    assert resumed.schedulers["scheduler"].last_epoch == 15
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**5)


def test_sharded_checkpoint_round_trip_without_a_process_group(tmp_path: Path) -> None:
    ddpkit.init()
    model, other = toy_model(seed=1), toy_model(seed=2)
    opt = torch.optim.Adam(model.parameters())
    opt_other = torch.optim.Adam(other.parameters())
    path = save_sharded(model, [opt], {"epoch": 3}, tmp_path, Position(3))
    assert read_sharded_extra(path)["epoch"] == 3  # every shard file matches its digest
    load_sharded(other, [opt_other], path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, other.state_dict()[name]), name
    shard = next(path.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte inside the weights
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{shard.name} does not match its checksum"):
        read_sharded_extra(path)


class _Payload:
    def __reduce__(self) -> tuple:
        return (print, ("code ran while loading",))


def test_sharded_metadata_holding_code_is_refused(tmp_path: Path) -> None:
    (tmp_path / ".metadata").write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(pickle.UnpicklingError, match=r"refusing to load builtins\.print"):
        SafeFileSystemReader(tmp_path).read_metadata()
    with pytest.raises(CheckpointError, match="is missing: not a complete sharded checkpoint"):
        SafeFileSystemReader(tmp_path / "absent").read_metadata()


def test_one_seed_reproduces_and_rank_streams_are_distinct() -> None:
    ddpkit.init(seed=11)
    first = torch.rand(3)
    ddpkit.shutdown()
    ddpkit.init(seed=11)
    assert torch.equal(first, torch.rand(3))
    assert len({rank_seed(11, r) for r in range(64)}) == 64
    with pytest.raises(ConfigError, match="seed must be an integer"):
        ddpkit.seed_everything(-1)


def test_top5_accuracy_is_reported_for_more_than_five_classes() -> None:
    ddpkit.init(hang_timeout=0)
    sums = MetricSums(torch.device("cpu"))
    outputs = torch.tensor([[9.0, 8, 7, 6, 5, 4, 0], [0, 1, 2, 3, 4, 5, 9]])
    targets = torch.tensor([4, 0])  # 4 is in row 0's top 5 only
    sums.add({"loss": torch.tensor(1.0), **classifier_metrics(outputs, targets)}, samples=2)
    assert sums.reduce() == {"loss": 1.0, "samples": 2.0, "accuracy": 0.0, "top5_accuracy": 0.5}
    assert "top5_accuracy" not in classifier_metrics(outputs[:, :5], targets)  # always 1 there


def test_log_every_prints_rank0s_loss_every_n_steps(capsys: pytest.CaptureFixture[str]) -> None:
    ddpkit.init(hang_timeout=0)
    model = toy_model()
    trainer = ddpkit.Trainer(
        model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy, log_every=2
    )
    trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=8), epochs=1)  # 5 steps
    lines = [line for line in capsys.readouterr().out.splitlines() if "  batch " in line]
    assert [line.split("  loss")[0] for line in lines] == [
        "epoch 1/1  batch 2/5",
        "epoch 1/1  batch 4/5",
    ]


def test_resume_loads_the_newest_checkpoint_without_training(tmp_path: Path) -> None:
    ddpkit.init(hang_timeout=0)

    def trainer() -> ddpkit.Trainer:
        model = toy_model(seed=9)
        return ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1),
                              F.cross_entropy, tmp_path)  # fmt: skip

    assert trainer().resume() is False  # nothing saved yet
    first = trainer()
    first.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=8), epochs=2)
    second = trainer()
    assert second.resume() is True and second.epoch == 2 and second.step == 10
    for name, tensor in first.model.state_dict().items():
        assert torch.equal(tensor, second.model.state_dict()[name]), name
