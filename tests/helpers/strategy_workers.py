"""Worker functions for the strategy and training-feature tests (module level for spawn)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, Dataset, Subset

import ddpkit
from helpers.mp_workers import crash_before_step, toy_dataset, toy_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def with_options(strategy: str, **options: Any) -> Any:
    """``strategy`` as its object holding the ``options`` given (None or () left out); by name
    when there are none."""
    given = {name: value for name, value in options.items() if value not in (None, ())}
    if not given:
        return strategy
    kinds = {"ddp": ddpkit.DDPStrategy, "fsdp": ddpkit.FSDPStrategy, "hsdp": ddpkit.HSDPStrategy}
    return kinds[strategy](**given)


def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Whole parameters on CPU, whatever the strategy (FSDP's shards are gathered: collective)."""
    state = ddpkit.unwrap_model(model).state_dict()
    return {
        k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu().clone()
        for k, v in state.items()
    }


def train_toy(
    strategy: str,
    per_device: int,
    epochs: int = 2,
    clip: float | None = 0.05,
    folder: str | None = None,
    save_every: int | None = None,
    seed_per_rank: bool = False,
    save_every_steps: int | None = None,
    crash_at: int | None = None,
    async_save: bool = False,
) -> dict[str, torch.Tensor]:
    """Adam + clipping on the toy task under ``strategy``; the final whole parameters.

    ``crash_at=S`` raises before optimizer step S (a crash to resume from)."""
    world = ddpkit.init(timeout=60)
    model = toy_model(seed=world.rank if seed_per_rank else 0)
    units = (nn.Linear,) if strategy == "fsdp" else ()
    model = ddpkit.prepare_model(model, with_options(strategy, units=units))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    trainer = ddpkit.Trainer(
        model, optimizer, F.cross_entropy, folder, save_every=save_every, clip_grad_norm=clip,
        save_every_steps=save_every_steps, async_save=async_save,
    )  # fmt: skip
    if crash_at is not None:
        crash_before_step(trainer, crash_at, RuntimeError)
    trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=per_device), epochs=epochs)
    return full_state(model)


def initial_weights(strategy: str) -> dict[str, torch.Tensor]:
    """Each rank builds its model from a different seed; return the prepared weights."""
    world = ddpkit.init(timeout=60, seed=7)
    model = ddpkit.prepare_model(toy_model(seed=100 + world.rank), strategy)
    return full_state(model)


def load_example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"{name}_example", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def load_wine() -> Any:
    return load_example("wine")


def wine_accuracy(comm_hooks: list[str | None], epochs: int, precision: str = "fp32") -> list:
    """(test accuracy, test loss) of the wine example trained once per comm hook (None: plain
    all-reduce)."""
    ddpkit.init(timeout=120)
    wine = load_wine()
    train_set, test_set = wine.load_data()
    accuracies = []
    for hook in comm_hooks:
        torch.manual_seed(0)
        model = ddpkit.prepare_model(wine.make_model(), with_options("ddp", comm_hook=hook))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy, precision=precision)
        trainer.fit(ddpkit.prepare_loader(train_set, batch_size=32), epochs=epochs)
        result = trainer.evaluate(ddpkit.prepare_loader(test_set, 32, shuffle=False))
        accuracies.append((result["accuracy"], result["loss"]))
    return accuracies


def sgd_with_policy(
    batch_size: int, policy: str, n: int = 128, uneven: str = "pad"
) -> dict[str, Any]:
    """SGD on n toy samples with a batch policy; the parameters, the plan, the startup line."""
    ddpkit.init(timeout=60)
    plan = ddpkit.plan_batch(batch_size, policy, lr=0.1, lr_scaling="linear")
    model = ddpkit.prepare_model(toy_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # the unscaled rate: same math
    trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy)
    loader = ddpkit.prepare_loader(toy_dataset(n), plan, uneven=uneven)
    trainer.fit(loader, epochs=2)
    return {"state": full_state(model), "plan": plan, "startup": trainer.setup.describe()}


class RandomItems(Dataset[torch.Tensor]):
    """Each item is fresh randomness: what a random augmentation draws."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.rand(1)


def augmentation_draws(seed: int) -> dict[str, list[float]]:
    """Random draws in DataLoader workers and in the main process after training starts."""
    ddpkit.init(timeout=60, seed=seed)
    loader = ddpkit.prepare_loader(RandomItems(), batch_size=4, shuffle=False, num_workers=1)
    in_workers = [float(x) for batch in loader for x in batch]
    model = ddpkit.prepare_model(toy_model())
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
    trainer.fit(ddpkit.prepare_loader(toy_dataset(8), batch_size=4), epochs=1)
    return {"workers": in_workers, "main": torch.rand(3).tolist()}


def uneven_batches(strategy: str) -> dict[str, Any] | str:
    """Rank 0 gets 5 batches, rank 1 gets 3, from a plain DataLoader (no DistributedSampler)."""
    world = ddpkit.init(timeout=60)
    data = toy_dataset(40)
    mine = Subset(data, range(0, 20) if world.rank == 0 else range(20, 32))
    model = ddpkit.prepare_model(toy_model(), strategy)
    trainer = ddpkit.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy)
    try:
        history = trainer.fit(DataLoader(mine, batch_size=4), epochs=2)
    except ddpkit.ConfigError as err:
        return str(err)
    return {"history": history, "state": full_state(model)}


def strategy_errors() -> dict[str, str]:
    """What prepare_model and the Trainer say about impossible requests in a 2-rank world."""
    ddpkit.init(timeout=60)
    messages = {}
    for name, request in {
        "dp": lambda: ddpkit.prepare_model(toy_model(), "dp"),
        "hook_on_fsdp": lambda: ddpkit.prepare_model(toy_model(), "fsdp", comm_hook="bf16"),
        "hook_on_fsdp_object": lambda: ddpkit.FSDPStrategy(comm_hook="bf16"),
        "global_odd": lambda: ddpkit.plan_batch(7, "global"),
    }.items():
        try:
            request()
            messages[name] = "no error"
        except ddpkit.ConfigError as err:
            messages[name] = str(err)
    return messages


def two_optimizers_resumed(strategy: str, folder: str) -> dict[str, Any]:
    """One Adam per layer, each stepped every batch: 4 epochs straight, and 2 epochs then a
    resume to 4 in another folder (checkpoints every epoch). Both runs' final parameters."""
    ddpkit.init(timeout=60)

    def fit(where: str, epochs: int) -> dict[str, torch.Tensor]:
        units = (nn.Linear,) if strategy == "fsdp" else ()
        model = ddpkit.prepare_model(toy_model(), with_options(strategy, units=units))
        layers = ddpkit.unwrap_model(model)
        optimizers = {
            "first": torch.optim.Adam(layers[0].parameters(), lr=1e-2),
            "second": torch.optim.Adam(layers[2].parameters(), lr=3e-2),
        }
        trainer = ddpkit.Trainer(model, optimizers, F.cross_entropy, where, save_every=1)
        trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=4), epochs=epochs)
        return full_state(model)

    straight = fit(f"{folder}/straight", 4)
    fit(f"{folder}/cut", 2)
    return {"straight": straight, "resumed": fit(f"{folder}/cut", 4)}


class CountBatches(ddpkit.Callback):
    """How many training batches this process ran (each one optimizer step here)."""

    rank_zero_only = False

    def __init__(self) -> None:
        self.n = 0

    def on_train_batch_end(self, trainer: Any, batch: Any, metrics: Any) -> None:
        self.n += 1


def train_hybrid(
    strategy: str,
    shard_size: int | None,
    folder: str,
    epochs: int = 3,
    crash_at: int | None = None,
) -> dict[str, Any]:
    """Adam on 64 toy samples at a global batch of 16 (4 steps an epoch, whatever the world
    size), checkpointing every 2 steps; the final whole parameters, the start-up line and
    the optimizer steps this run took. ``shard_size`` goes to HSDP; ``crash_at=S`` raises
    before optimizer step S."""
    ddpkit.init(timeout=60)
    sharded = with_options(strategy, units=(nn.Linear,), shard_size=shard_size)
    model = ddpkit.prepare_model(toy_model(), sharded)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    counted = CountBatches()
    trainer = ddpkit.Trainer(
        model, optimizer, F.cross_entropy, folder, save_every_steps=2, callbacks=[counted]
    )
    if crash_at is not None:
        crash_before_step(trainer, crash_at, RuntimeError)
    loader = ddpkit.prepare_loader(toy_dataset(64), ddpkit.plan_batch(16, "global"))
    trainer.fit(loader, epochs=epochs)
    return {"state": full_state(model), "startup": trainer.setup.describe(), "steps": counted.n}


def gpt_with_recompute(
    strategy: str, recompute: bool, compile_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Four AdamW steps of the GPT example on fixed batches: the final whole parameters, how
    many Block forwards ran in each step (uncompiled runs only: 0 when compiled), and how
    many graphs Dynamo compiled in this process.

    Equal parameters alone cannot tell that recomputation or compiling happened (both change
    no numbers), so the worker also returns what each of them leaves behind: a recomputed
    Block runs its forward again in backward, and a compiled model leaves Dynamo graphs."""
    ddpkit.init(timeout=120, seed=0)
    gpt = load_example("gpt")
    units = (gpt.Block,) if strategy != "ddp" else ()
    options: dict[str, Any] = {"activation_checkpointing": (gpt.Block,)} if recompute else {}
    if compile_options is not None:
        options["compile"] = compile_options
    model = ddpkit.prepare_model(gpt.GPT(gpt.GPTConfig()), with_options(strategy, units=units),
                                 **options)  # fmt: skip
    blocks = [m for m in ddpkit.unwrap_model(model).modules() if isinstance(m, gpt.Block)]
    # Not counted when compiled: Dynamo cannot trace a hook's side effect inside a checkpointed
    # block, and would run the whole forward eagerly, the very thing that run must rule out.
    ran = count_forwards(blocks if compile_options is None else [])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(ddpkit.current_world().rank)
    forwards: list[int] = []
    for _ in range(4):
        ids = torch.randint(0, 256, (4, 65), generator=generator)
        model(input_ids=ids[:, :-1], labels=ids[:, 1:]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        forwards.append(len(ran))
        ran.clear()
    return {
        "state": full_state(model), "blocks": len(blocks), "forwards": forwards,
        "graphs": dynamo_graphs(),
    }  # fmt: skip


def count_forwards(modules: list[nn.Module]) -> list[int]:
    """A list that grows by one at each forward call of any of ``modules``.

    Hooked on the user's blocks, inside any checkpoint wrapper, the hook fires on the
    wrapper's forward and again when backward recomputes it: that second call is what
    activation checkpointing is, and a wrapper dropped silently leaves only the first. A
    pre-hook, because the recomputation stops once it has rebuilt the last saved tensor,
    before the block's forward returns: a forward (post) hook would never see it."""
    calls: list[int] = []
    for module in modules:
        module.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def dynamo_graphs() -> int:
    """How many distinct graphs Dynamo compiled in this process: 0 when nothing was compiled
    (``torch.compile`` dropped silently runs eagerly and leaves no graph)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def started_on_meta(strategy: str, weights: str, shard_size: int | None = None) -> dict[str, Any]:
    """The GPT built on the meta device and prepared from ``weights``: its whole parameters
    and the elements of this rank's local shards."""
    ddpkit.init(timeout=120)
    gpt = load_example("gpt")
    with torch.device("meta"):
        model = gpt.GPT(gpt.GPTConfig())
    units = (gpt.Block,) if strategy != "ddp" else ()
    sharded = with_options(strategy, units=units, shard_size=shard_size)
    model = ddpkit.prepare_model(model, sharded, weights=weights)
    local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())
    return {"state": full_state(model), "local": local}


def sharded_with_policy(strategy: str, mixed_precision: str | None) -> dict[str, Any]:
    """A few Adam steps of the toy model under FSDP/HSDP with ``mixed_precision``: the
    start-up line, the dtypes a Linear computes in, the sharded parameters' and their
    gradients' dtypes, and the final whole parameters."""
    world = ddpkit.init(timeout=60)
    sharded = with_options(strategy, units=(nn.Linear,), mixed_precision=mixed_precision)
    model = ddpkit.prepare_model(toy_model(), sharded)
    seen: list[str] = []
    first = ddpkit.unwrap_model(model)[0]
    first.register_forward_hook(lambda _m, args, out: seen.append(str(out.dtype)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    trainer = ddpkit.Trainer(model, optimizer, F.cross_entropy)
    trainer.fit(ddpkit.prepare_loader(toy_dataset(), batch_size=4), epochs=1)
    return {
        "startup": trainer.setup.describe(), "computed": sorted(set(seen)),
        "params": sorted({str(p.dtype) for p in model.parameters()}),
        "state": full_state(model), "device": str(world.device),
    }  # fmt: skip
