"""The `gpucluster` command (typer): `app` and the console-script entry `main`."""

from gpucluster.cli import capacity as capacity  # registers `gpucluster capacity` on the app
from gpucluster.cli.commands import app, main

__all__ = ["app", "main"]
