"""Steps of your own: dict batches, metrics, callbacks, several models, your own state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import ddpkit
from ddpkit.checkpoint import list_checkpoints, load_checkpoint
from ddpkit.errors import ConfigError
from ddpkit.runtime.callbacks import HOOKS, register_callback, unregister_callback
from helpers.mp_workers import cpu_state, toy_dataset, toy_model


class DictData(Dataset):
    """The toy task as an LM-style dataset: dict samples."""

    def __init__(self) -> None:
        self.inner = toy_dataset()

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        x, y = self.inner[index]
        return {"features": x, "labels": y}


class HFStyle(nn.Module):
    """Called as ``model(**batch)``; returns an object with ``.loss``, as HF models do."""

    def __init__(self) -> None:
        super().__init__()
        self.net = toy_model()

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> Any:
        logits = self.net(features)
        return type("Output", (), {"loss": F.cross_entropy(logits, labels), "logits": logits})


def test_a_step_function_over_dict_batches_trains_as_the_default_step_does() -> None:
    ddpkit.init(hang_timeout=0)
    model = ddpkit.prepare_model(HFStyle())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer = ddpkit.Trainer(model, opt, training_step=lambda batch: model(**batch).loss)
    trainer.fit(ddpkit.prepare_loader(DictData(), batch_size=8, shuffle=False), epochs=2)
    ddpkit.shutdown()
    ddpkit.init(hang_timeout=0)  # the same training through the classifier's default step
    plain = ddpkit.prepare_model(toy_model())
    ddpkit.Trainer(plain, torch.optim.SGD(plain.parameters(), lr=0.1), F.cross_entropy).fit(
        ddpkit.prepare_loader(toy_dataset(), batch_size=8, shuffle=False), epochs=2
    )
    assert all(
        torch.equal(a, b)
        for a, b in zip(cpu_state(model.net).values(), cpu_state(plain).values(), strict=True)
    )
    trained = {k for k in trainer.history[-1] if not k.startswith(("time/", "mem/"))}
    assert trained == {"epoch", "loss", "samples", "time_s"}


class Weighted(ddpkit.Trainer):
    """Reports a metric of its own, with a sample count of its own."""

    def training_step(self, batch: Any) -> dict[str, Any]:
        x, y = batch
        return {"loss": F.cross_entropy(self.model(x), y), "share": 1.0, "samples": 2 * len(y)}

    def validation_step(self, batch: Any) -> dict[str, Any]:
        _, y = batch
        return {"positive": (y > 0).double().mean()}


def test_step_metrics_are_sample_weighted_shown_and_kept(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ddpkit.init(hang_timeout=0)
    model = ddpkit.prepare_model(toy_model())
    data = toy_dataset()
    trainer = Weighted(model, torch.optim.SGD(model.parameters(), lr=0.1))
    val = ddpkit.prepare_loader(data, batch_size=16, shuffle=False)  # batches of 16, 16, 8
    history = trainer.fit(ddpkit.prepare_loader(data, batch_size=8), epochs=1, val=val)
    expected = float((data.tensors[1] > 0).double().mean())
    assert history[0]["samples"] == 80 and history[0]["share"] == 1.0
    assert history[0]["val_positive"] == pytest.approx(expected, abs=1e-12)
    assert "share 1.0000  val_positive " in capsys.readouterr().out


def test_bad_steps_are_named() -> None:
    ddpkit.init(hang_timeout=0)
    model = ddpkit.prepare_model(toy_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = ddpkit.prepare_loader(toy_dataset(), batch_size=8)
    with pytest.raises(ConfigError, match="needs a loss_fn for its default"):
        ddpkit.Trainer(model, opt)
    no_loss = ddpkit.Trainer(model, opt, training_step=lambda batch: {"acc": 1.0})
    with pytest.raises(ConfigError, match='training_step returned a mapping without "loss"'):
        no_loss.fit(loader, epochs=1)
    vector = ddpkit.Trainer(
        model, opt, training_step=lambda b: {"loss": model(b[0]).sum(), "v": b[1]}
    )
    with pytest.raises(ConfigError, match=r"one number \(a mean\); got a tensor of shape \[8\]"):
        vector.fit(loader, epochs=1)
    with pytest.raises(
        ConfigError, match="expects each batch to be \\(inputs, targets\\); got a dict"
    ):
        ddpkit.Trainer(model, opt, F.cross_entropy).fit(ddpkit.prepare_loader(DictData(), 8), 1)


class Recorder(ddpkit.Callback):
    """Notes every hook it hears (each hook overridden, so the dispatcher calls it)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_save_checkpoint(self, trainer: Any, state: dict[str, Any]) -> None:
        self.calls.append("on_save_checkpoint")
        state["note"] = "from a callback"


def _noting(hook: str) -> Any:
    def note(self: Recorder, *args: Any) -> None:
        self.calls.append(hook)

    return note


for _hook in HOOKS:
    if _hook != "on_save_checkpoint":
        setattr(Recorder, _hook, _noting(_hook))


def test_callbacks_are_called_in_order_and_may_add_to_checkpoints(tmp_path: Path) -> None:
    ddpkit.init(hang_timeout=0)
    model = ddpkit.prepare_model(toy_model())
    recorder = Recorder()
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy,
                             tmp_path, callbacks=[recorder])  # fmt: skip
    data = ddpkit.prepare_loader(toy_dataset(n=16), batch_size=8)
    trainer.fit(data, epochs=1, val=data)
    assert recorder.calls == [
        "on_fit_start", "on_train_epoch_start", "on_train_batch_start", "on_train_batch_end",
        "on_train_batch_start", "on_train_batch_end", "on_validation_end", "on_train_epoch_end",
        "on_save_checkpoint", "on_fit_end",
    ]  # fmt: skip
    assert load_checkpoint(list_checkpoints(tmp_path)[-1])["note"] == "from a callback"
    recorder.calls.clear()
    assert trainer.resume() and "on_load_checkpoint" in recorder.calls
    with pytest.raises(ConfigError, match=r"must be ddpkit\.Callback instances"):
        ddpkit.Trainer(model, trainer.optimizer, F.cross_entropy, callbacks=[print])  # type: ignore[list-item]


class TinyGAN(ddpkit.Trainer):
    """Two models, two updates per batch, made by the step itself."""

    def training_step(self, batch: Any) -> dict[str, torch.Tensor]:
        x, _ = batch
        gen, disc = self.models["gen"], self.models["disc"]
        fake = gen(torch.ones(len(x), 2) * x[:, :2])
        logits = disc(torch.cat([x, torch.cat([fake.detach(), x[:, 2:]], dim=1)]))
        target = torch.cat([torch.ones(len(x), 1), torch.zeros(len(x), 1)])
        loss_d = F.binary_cross_entropy_with_logits(logits, target)
        self.backward(loss_d)
        self.optimizer_step(self.optimizers["disc"])
        loss_g = -disc(torch.cat([fake, x[:, 2:]], dim=1)).mean()
        self.backward(loss_g)
        self.optimizer_step(self.optimizers["gen"])
        self.optimizers["disc"].zero_grad(set_to_none=True)
        return {"loss_d": loss_d, "loss_g": loss_g}

    def validation_step(self, batch: Any) -> dict[str, torch.Tensor]:
        return {"fake_norm": self.models["gen"](batch[0][:, :2]).norm(dim=1).mean()}


def gan(
    folder: Path | None, ema: nn.Module | None = None, callbacks: tuple[Any, ...] = ()
) -> TinyGAN:
    torch.manual_seed(3)
    models = {
        "gen": ddpkit.prepare_model(nn.Linear(2, 2)),
        "disc": ddpkit.prepare_model(nn.Linear(6, 1)),
    }
    opts = {name: torch.optim.Adam(m.parameters(), lr=0.01) for name, m in models.items()}
    scheds = {name: torch.optim.lr_scheduler.StepLR(o, step_size=2) for name, o in opts.items()}
    state = {"ema": ema, "updates": 0} if ema is not None else None
    every = 3 if folder is not None else None
    return TinyGAN(models, opts, scheduler=scheds, checkpoint_dir=folder, save_every_steps=every,
                   state=state, manual_optimization=True, callbacks=callbacks)  # fmt: skip


class Stop(Exception):
    pass


def test_two_models_resume_bit_identically_with_their_schedulers_and_user_state(
    tmp_path: Path,
) -> None:
    ddpkit.init(hang_timeout=0)
    loader = ddpkit.prepare_loader(toy_dataset(), batch_size=8)
    straight = gan(None)
    straight.fit(loader, epochs=2, val=loader)
    expected = cpu_state(straight.model)
    ema = nn.Linear(1, 1)
    first = gan(tmp_path, ema, callbacks=(StopAt(7),))
    with pytest.raises(Stop):
        first.fit(loader, epochs=2)
    with torch.no_grad():
        ema.weight.fill_(9.0)  # the saved EMA must come back
    resumed = gan(tmp_path, ema)
    resumed.fit(loader, epochs=2, val=loader)
    assert {
        k: torch.equal(v, expected[k]) for k, v in cpu_state(resumed.model).items()
    } == dict.fromkeys(expected, True)
    assert resumed.schedulers["gen"].last_epoch == straight.schedulers["gen"].last_epoch == 10
    assert ema.weight.item() != 9.0 and resumed.state["updates"] == 0
    saved = load_checkpoint(list_checkpoints(tmp_path)[-1])
    assert set(saved["model"]) == {"gen.weight", "gen.bias", "disc.weight", "disc.bias"}
    assert set(saved["optimizers"]) == set(saved["schedulers"]) == {"gen", "disc"}
    assert resumed.history[-1].keys() >= {"loss_d", "loss_g", "val_fake_norm"}


class StopAt(ddpkit.Callback):
    rank_zero_only = False

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Any) -> None:
        if trainer.step == self.step:
            raise Stop


def test_a_manual_step_is_declared_and_needs_a_validation_step_even_before_fit() -> None:
    ddpkit.init(hang_timeout=0)
    loader = ddpkit.prepare_loader(toy_dataset(n=16), batch_size=8)
    models = {"a": ddpkit.prepare_model(nn.Linear(6, 1))}
    opt = {"a": torch.optim.SGD(models["a"].parameters(), lr=0.1)}

    def manual(batch: Any) -> None:
        trainer.backward(models["a"](batch[0]).mean())
        trainer.optimizer_step()

    trainer = ddpkit.Trainer(models, opt, training_step=manual)
    with pytest.raises(ConfigError, match=r"declared with Trainer\(\.\.\., manual_optimization"):
        trainer.fit(loader, epochs=1)
    trainer = ddpkit.Trainer(models, opt, training_step=manual, manual_optimization=True)
    with pytest.raises(ConfigError, match="cannot double as the validation step"):
        trainer.evaluate(loader)  # before any fit: known from the declaration, not a first step
    with pytest.raises(ConfigError, match=r"several models \(a\) .* give it a training_step"):
        ddpkit.Trainer(models, opt, F.mse_loss)


def accumulating_trainer(manual: bool) -> ddpkit.Trainer:
    """accumulate=2 on the toy model: the default step, or the same made by hand."""
    model = ddpkit.prepare_model(toy_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(batch: Any) -> Any:
        loss = F.cross_entropy(model(batch[0]), batch[1])
        if not manual:
            return loss
        trainer.backward(loss)
        trainer.optimizer_step()
        return {"loss": loss}

    trainer = ddpkit.Trainer(model, opt, training_step=step, accumulate=2,
                             manual_optimization=manual)  # fmt: skip
    return trainer


def test_a_manual_step_accumulates_like_the_default_one() -> None:
    """accumulate=2 with a manual step: one update per two batches, with their mean gradient."""
    ddpkit.init(hang_timeout=0)
    loader = ddpkit.prepare_loader(toy_dataset(n=16), batch_size=4, shuffle=False)
    automatic, by_hand = accumulating_trainer(False), accumulating_trainer(True)
    for trainer in (automatic, by_hand):
        trainer.fit(loader, epochs=1)
    assert automatic.step == by_hand.step == 2
    expected = cpu_state(automatic.model)
    assert all(torch.equal(expected[k], v) for k, v in cpu_state(by_hand.model).items())


def test_a_callback_registered_mid_epoch_gets_the_next_batches_hooks() -> None:
    """The per-batch hooks are skipped where no callback has them, yet one registered during
    an epoch (register_callback: every run of the process) is called from the next batch on,
    and not after it is unregistered."""
    seen: list[tuple[str, int]] = []

    class Counting(ddpkit.Callback):
        def on_train_batch_start(self, trainer: Any, batch: Any) -> None:
            seen.append(("start", trainer.step))

        def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Any) -> None:
            seen.append(("end", trainer.step))

    ddpkit.init()
    model = ddpkit.prepare_model(nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.ones(8, 2), torch.zeros(8, 1))
    loop = ddpkit.TrainLoop({"model": model, "optimizer": optimizer})
    counting = Counting()
    try:
        for _epoch in loop.epochs(1):
            for x, y in loop.batches(ddpkit.prepare_loader(data, batch_size=2)):
                loop.backward(F.mse_loss(model(x), y))
                loop.optimizer_step(optimizer)
                if loop.step == 1:
                    register_callback(counting)
                if loop.step == 3:
                    unregister_callback(counting)
    finally:
        unregister_callback(counting)
    # registered in the body of the batch that makes step 2: its end, then the next batch whole,
    # then the start of the batch in whose body it was unregistered
    assert seen == [("end", 2), ("start", 2), ("end", 3), ("start", 3)]
