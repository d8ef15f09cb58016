"""How a model is made data-parallel: one strategy descriptor per name (ddp, fsdp, dp,
none) behind ``prepare_model``; DDP comm hooks; the replica check."""
