"""Pulumi entry point (`pulumi up -s <env>`): the program lives in components/program.py."""

from components.program import run

run()
