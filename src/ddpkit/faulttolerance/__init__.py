"""**Experimental.** Replica groups that train on when one fails: a layer composed around
whatever trains inside each group, through torchft (``pip install 'ddpkit[ft]'``).

- :mod:`~ddpkit.faulttolerance.groups`: :class:`~ddpkit.ReplicaGroups`, what the user makes
  and hands the loop; its options and the loop's calls at each step.
- :mod:`~ddpkit.faulttolerance.manager`: torchft's Manager of one group: the quorum, the
  exchange and the vote of each step, started with the run.
- :mod:`~ddpkit.faulttolerance.batches`: the batches dealt among the groups alive at each
  step, each sample once per epoch.
- :mod:`~ddpkit.faulttolerance.buckets`: the gradients packed into a few flat buckets, the
  same on every group, for the exchange.
- :mod:`~ddpkit.faulttolerance.heal`: a group that comes back receives the run's state from a
  live peer (loaded with ``weights_only=True``); the lighthouse.
- :mod:`~ddpkit.faulttolerance.members`: which groups took part in each step, said when it
  changes.
- :mod:`~ddpkit.faulttolerance.quorum`: quorum numbers kept unique across a lighthouse's
  restarts.

Example::

    groups = ddpkit.ReplicaGroups()                 # DDPKIT_FT_GROUP, TORCHFT_LIGHTHOUSE
    trainer = ddpkit.Trainer(model, optimizer, loss_fn, replica_groups=groups)
    trainer.fit(groups.batches(train_set, batch_size=32), epochs=10)
"""
