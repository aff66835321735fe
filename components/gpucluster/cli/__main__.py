"""`python -m gpucluster.cli`: the same command as the `gpucluster` console script."""

from gpucluster.cli import main

main()
