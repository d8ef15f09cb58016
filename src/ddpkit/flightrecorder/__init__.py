"""torch's Flight Recorder, for naming a hang at the collective: armed in every worker before
its first process group (:mod:`.arming`), read as plain data (:mod:`.records`), and the
verdict from every rank's records (:mod:`.verdict`) that the hang report, the launcher and
``ddpkit doctor --dumps`` share. torch keeps its own analyzer in a package of its own
(``torch.distributed.flight_recorder``); this is ddpkit's.
"""
