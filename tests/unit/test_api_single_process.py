"""The public API in a world of one: same calls, no process group, clear errors on misuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import IterableDataset, TensorDataset

import ddpkit
from ddpkit import ConfigError, NotInitializedError


def test_prepare_loader_before_init_says_to_call_init() -> None:
    data = TensorDataset(torch.zeros(4, 2))
    with pytest.raises(NotInitializedError, match=r"ddpkit\.init\(\) has not been called"):
        ddpkit.prepare_loader(data, batch_size=2)


def test_prepare_model_before_init_says_to_call_init() -> None:
    with pytest.raises(NotInitializedError):
        ddpkit.prepare_model(torch.nn.Linear(2, 2))


def test_init_without_launcher_makes_no_process_group(capsys: pytest.CaptureFixture[str]) -> None:
    world = ddpkit.init()
    assert world.world_size == 1 and not torch.distributed.is_initialized()
    assert ddpkit.init() is world  # a second call returns the same world
    assert "world size 1" in capsys.readouterr().out  # the choice is printed once


def test_collectives_are_identity_in_a_world_of_one() -> None:
    ddpkit.init()
    tensor = torch.tensor([1.0, 2.0])
    assert ddpkit.all_reduce_mean(tensor) is tensor
    assert ddpkit.all_reduce_sum(2.5) == 2.5
    assert ddpkit.is_main() and ddpkit.get_rank() == 0
    ddpkit.barrier()


def test_model_is_left_unwrapped_in_a_world_of_one() -> None:
    ddpkit.init()
    model = torch.nn.Linear(3, 2)
    assert ddpkit.prepare_model(model) is model


def test_unknown_strategy_lists_the_choices() -> None:
    ddpkit.init()
    choices = "'ddp', 'fsdp', 'hsdp', 'dp', 'none'"
    with pytest.raises(ConfigError, match=f"unknown strategy 'zero3'; choose one of {choices}"):
        ddpkit.prepare_model(torch.nn.Linear(2, 2), strategy="zero3")


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_bad_batch_size_is_named(bad: object) -> None:
    ddpkit.init()
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        ddpkit.prepare_loader(TensorDataset(torch.zeros(4)), batch_size=bad)  # type: ignore[arg-type]


def test_loader_refuses_a_sampler_of_its_own() -> None:
    ddpkit.init()
    with pytest.raises(ConfigError, match="sets the DataLoader's sampler itself"):
        ddpkit.prepare_loader(TensorDataset(torch.zeros(4)), batch_size=2, sampler=[0, 1])


def test_loader_takes_iterable_datasets() -> None:
    class Stream(IterableDataset):  # type: ignore[type-arg]
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(3))

    ddpkit.init()
    assert [b.tolist() for b in ddpkit.prepare_loader(Stream(), batch_size=2)] == [[0, 1], [2]]


def test_save_every_without_a_folder_is_refused() -> None:
    ddpkit.init()
    model = ddpkit.prepare_model(torch.nn.Linear(2, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="save_every needs a checkpoint_dir"):
        ddpkit.Trainer(model, opt, F.cross_entropy, save_every=2)


def test_trainer_names_a_wrong_batch_shape() -> None:
    ddpkit.init()
    model = ddpkit.prepare_model(torch.nn.Linear(2, 2))
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.mse_loss)
    loader = ddpkit.prepare_loader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
    with pytest.raises(ConfigError, match="expects each batch to be \\(inputs, targets\\)"):
        trainer.fit(loader, epochs=1)


def test_fit_reports_sample_weighted_metrics_and_learns() -> None:
    ddpkit.init()
    torch.manual_seed(0)
    x = torch.randn(64, 2)
    y = (x[:, 0] > 0).long()  # learnable: the sign of the first feature
    model = ddpkit.prepare_model(torch.nn.Linear(2, 2))
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.5), F.cross_entropy)
    loader = ddpkit.prepare_loader(TensorDataset(x, y), batch_size=10)  # last batch has 4
    history = trainer.fit(loader, epochs=15, val=loader)
    assert [h["epoch"] for h in history] == list(range(1, 16))
    assert history[-1]["loss"] < history[0]["loss"]
    assert history[-1]["val_accuracy"] > 0.9
    with torch.no_grad():
        expected = F.cross_entropy(model(x), y).item()
    assert trainer.evaluate(loader)["loss"] == pytest.approx(expected, rel=1e-5)


def test_unknown_ddp_option_is_named() -> None:
    with pytest.raises(ConfigError, match=r"DDPStrategy has no option 'bucket_size'; its "
                       r"options: bucket_cap_mb, "):  # fmt: skip
        ddpkit.DDPStrategy(bucket_size=25)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("options", "message"),
    [({"accumulate": 0}, "accumulate must be a positive integer"),
     ({"clip_grad_norm": 0.0}, "clip_grad_norm must be > 0")],
)  # fmt: skip
def test_bad_trainer_options_are_named(options: dict[str, float], message: str) -> None:
    ddpkit.init()
    model = ddpkit.prepare_model(torch.nn.Linear(2, 2))
    with pytest.raises(ConfigError, match=message):
        ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.mse_loss, **options)
