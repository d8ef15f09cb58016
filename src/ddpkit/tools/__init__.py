"""The commands beyond ``run``: verify, doctor, bench, slurm. Each may use any layer below
and none of the others."""
