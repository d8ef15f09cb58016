"""How a model is made data-parallel: one strategy descriptor per name (ddp, fsdp, hsdp, dp,
none) behind ``prepare_model``, each holding its options; several models as one; DDP comm
hooks; recompute and FSDP's precision policy; weights from files and the meta device; the
replica check. Compiling (``ddpkit.compiling``) and replica groups
(``ddpkit.faulttolerance``) are rooms of their own."""
