"""Slurm for gpucluster node groups (issue 28): the batch scripts jobs are submitted as and the
`squeue`/`sacct`/`scancel` command lines and their parsing. Pure: no Pulumi, no AWS client.

- `batch`: a node group's Slurm view (`SlurmGroup`) and the sbatch script of a job on it.
- `queue`: job records from `squeue`/`sacct`/`scontrol show job` output, and `scancel`.
- `remote`: the scripts a Slurm stack's day-2 commands run on its login node (carried base64 in
  one SSM line; jobs submitted as uid 1000) and their output parsed: sbatch, jobs, output, cancel,
  sinfo.
- `usage`: GPU-hours per user and per job from `sacct`, priced per node-hour (`spend --by`).
"""
