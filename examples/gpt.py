"""A small GPT, byte-level, trained on Python's own argparse.py: a language model under ddpkit.

nanoGPT's shape at a few hundred thousand parameters (3 blocks of causal self-attention and
MLP, 96-wide, 4 heads, 64-byte context), trained on the source text of the standard
library's ``argparse`` module (about 100 kB that every Python ships; no download). Batches
are dicts of token ids, the model is called as Hugging Face models are,
``model(**batch).loss``, and the optimizer is AdamW with a cosine schedule after a linear
warm-up. The validation loss and perplexity are reported each epoch.

    python examples/gpt.py --epochs 6                      # one process
    ddpkit run --nproc 2 examples/gpt.py --epochs 6        # two workers, DDP over gloo
    ddpkit run --nproc 2 --max-restarts 1 examples/gpt.py --checkpoint-dir runs/gpt \
        --save-every-steps 20                              # survives a worker's crash
    ddpkit verify examples/gpt.py --workers 2 --steps 10   # N workers == 1 process
    ddpkit run --nproc 2 examples/gpt.py --strategy fsdp --activation-checkpointing
                                                           # blocks sharded, recomputed
    ddpkit run --nproc 2 examples/gpt.py --strategy fsdp --weights gpt.safetensors
                                        # built on the meta device, each rank its shards
"""

from __future__ import annotations

import argparse
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

import ddpkit


@dataclass
class GPTConfig:
    vocab_size: int = 256  # bytes
    block_size: int = 64  # context, in bytes
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 96


@dataclass
class LMOutput:
    """What the model returns, as a Hugging Face causal LM does: ``.loss`` and ``.logits``."""

    loss: torch.Tensor | None
    logits: torch.Tensor


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention, then an MLP."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.ln_1 = nn.LayerNorm(config.n_embd)
        # No bias: a key bias shifts a row of scores by a constant, which softmax ignores. Its
        # gradient is zero up to rounding, and Adam would turn that rounding into real steps.
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(config.n_embd, 4 * config.n_embd),
            nn.GELU(),
            nn.Linear(4 * config.n_embd, config.n_embd),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Token and position embeddings, blocks, a final norm and a head tied to the embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.positions = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.tokens.weight  # weight tying, as GPT-2 does
        self.apply(_init_weights)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> LMOutput:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tokens(input_ids) + self.positions(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return LMOutput(loss=loss, logits=logits)


def _init_weights(module: nn.Module) -> None:
    # GPT-2's initialization: small weights, so the first logits are near uniform (loss ~ln 256).
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class ByteWindows(Dataset):
    """Non-overlapping windows of a byte string: ``input_ids`` and the next bytes as ``labels``."""

    def __init__(self, data: torch.Tensor, block_size: int) -> None:
        self.data, self.block_size = data, block_size

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block_size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = index * self.block_size
        window = self.data[start : start + self.block_size + 1].long()
        return {"input_ids": window[:-1], "labels": window[1:]}


def load_text(block_size: int) -> tuple[ByteWindows, ByteWindows]:
    """argparse.py's source as bytes: the first 90% to train on, the rest to validate."""
    data = torch.frombuffer(bytearray(inspect.getsource(argparse).encode()), dtype=torch.uint8)
    split = int(len(data) * 0.9)
    return ByteWindows(data[:split], block_size), ByteWindows(data[split:], block_size)


def cosine_with_warmup(warmup: int, total: int):
    """LR factor: linear warm-up for ``warmup`` steps, then cosine decay to 10%."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))

    return factor


class LMTrainer(ddpkit.Trainer):
    """The Trainer with a language model's steps: dict batches, ``model(**batch).loss``."""

    def training_step(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(**batch).loss

    def validation_step(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"loss": self.model(**batch).loss}


class Perplexity(ddpkit.Callback):
    """Adds the validation perplexity, exp(mean loss), to each epoch's metrics and line."""

    def on_train_epoch_end(self, trainer: ddpkit.Trainer, metrics: dict[str, float]) -> None:
        if "val_loss" in metrics:
            metrics["val_perplexity"] = math.exp(metrics["val_loss"])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=16, help="windows per device")
    parser.add_argument("--batch-policy", choices=["per_device", "global"], default="per_device",
                        help="global: --batch-size split over the ranks, kept when the world "
                             "size changes (an elastic job)")  # fmt: skip
    parser.add_argument("--lr", type=float, default=6e-3, help="peak, after warm-up")
    parser.add_argument("--warmup", type=int, default=20, help="warm-up steps")
    parser.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (resumes)")
    parser.add_argument("--save-every-steps", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategy", choices=["ddp", "fsdp", "hsdp"], default="ddp",
                        help="fsdp/hsdp shard each Block as a unit")  # fmt: skip
    parser.add_argument("--hsdp-shard-size", type=int, default=None, help="ranks per replica")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="recompute each Block's activations in backward")  # fmt: skip
    parser.add_argument("--weights", default=None,
                        help="start from these weights (.safetensors, .pt, a folder): the "
                             "model is built on the meta device, each rank reading only its "
                             "shards")  # fmt: skip
    return parser.parse_args()


def build(config: GPTConfig, args: argparse.Namespace) -> GPT:
    """The model: on the meta device (no memory) when its weights come from a file."""
    if args.weights is None:
        return GPT(config)
    with torch.device("meta"):
        return GPT(config)


def prepare(model: GPT, args: argparse.Namespace) -> nn.Module:
    """Wrap for the strategy asked; a sharded strategy makes each Block an FSDP unit."""
    strategies = {
        "ddp": ddpkit.DDPStrategy(),
        "fsdp": ddpkit.FSDPStrategy(units=(Block,)),
        "hsdp": ddpkit.HSDPStrategy(units=(Block,), shard_size=args.hsdp_shard_size),
    }
    recompute = (Block,) if args.activation_checkpointing else False
    return ddpkit.prepare_model(
        model, strategies[args.strategy], weights=args.weights, activation_checkpointing=recompute
    )


def main() -> None:
    args = parse_args()
    ddpkit.init(seed=args.seed)  # the same initial weights on every rank
    config = GPTConfig()
    train_set, val_set = load_text(config.block_size)
    model = prepare(build(config, args), args)
    plan = ddpkit.plan_batch(args.batch_size, args.batch_policy)
    train = ddpkit.prepare_loader(train_set, plan)
    val = ddpkit.prepare_loader(val_set, plan, shuffle=False)
    decay = [p for p in model.parameters() if p.dim() >= 2]  # weights decay; norms, biases not
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))
    total_steps = args.epochs * len(train)
    schedule = cosine_with_warmup(args.warmup, total_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    trainer = LMTrainer(
        model,
        optimizer,
        scheduler=scheduler,
        checkpoint_dir=args.checkpoint_dir,
        save_every_steps=args.save_every_steps,
        callbacks=[Perplexity()],
    )
    params = sum(p.numel() for p in model.parameters())
    ddpkit.print0(f"GPT: {params:,} parameters, {len(train_set)} training windows of "
                  f"{config.block_size} bytes")  # fmt: skip
    trainer.fit(train, epochs=args.epochs, val=val)
    result = trainer.evaluate(val)
    ddpkit.print0(f"validation loss {result['loss']:.4f}  perplexity {math.exp(result['loss']):.2f}"
                  f"  ({ddpkit.current_world().world_size} workers)")  # fmt: skip


if __name__ == "__main__":
    main()
