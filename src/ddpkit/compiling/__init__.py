"""``torch.compile`` in a distributed run: where it goes around the strategy's wrapper, and the
compiled kernels kept with the run so that a restart does not compile again.

- :mod:`~ddpkit.compiling.wrap`: compiled after wrapping (DDP's buckets, FSDP's units seen by
  the compiler), checkpoints as if never compiled (:func:`~ddpkit.compiling.wrap.uncompiled`).
- :mod:`~ddpkit.compiling.cache`: torch's compile cache kept in the run's checkpoint folder,
  named by the machine's fingerprint; what the first step compiled, said.
- :mod:`~ddpkit.compiling.keptkernels`: the same for a run whose checkpoints are in an object
  store (one archive per fingerprint, unpacked into a private folder), and the first step's
  cost.

Below the strategies (which only ask :func:`~ddpkit.compiling.wrap.uncompiled` what a model
is), above ``_compat`` (which reaches into inductor for the loop).
"""
