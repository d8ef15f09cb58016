"""Reading the topology: who this process is in the job (World), from torchrun, SLURM or
OpenMPI variables, host lists and init URLs. Reads the environment; never calls
torch.distributed."""
