"""Pulumi entry point (`pulumi up -s <env>`): the program lives in gpucluster/program.py."""

from gpucluster.program import run

run()
