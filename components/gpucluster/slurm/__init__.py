"""Slurm for gpucluster node groups (issue 28): the batch scripts jobs are submitted as and the
`squeue`/`sacct`/`scancel` command lines and their parsing. Pure: no Pulumi, no AWS client.

- `batch`: a node group's Slurm view (`SlurmGroup`) and the sbatch script of a job on it.
- `queue`: job records from `squeue`/`sacct`/`scontrol show job` output, and `scancel`.
"""
