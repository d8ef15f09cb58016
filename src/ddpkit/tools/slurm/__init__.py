"""``ddpkit slurm``: an sbatch script for a ddpkit job, checked against the partition."""
