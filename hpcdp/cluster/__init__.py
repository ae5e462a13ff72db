"""Everything Slurm: the batch script rendered by a pure function (`render`), sbatch and
script files (`submit`), the `hpcdp slurm` command (`cli`), sweeps, chains, site
profiles, containers and job status.

Imports neither Horovod nor PyTorch: it runs on login nodes.
"""
