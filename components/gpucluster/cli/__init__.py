"""The `gpucluster` command (typer): `app` and the console-script entry `main`.

`main` turns the cyclic garbage collector off before anything is imported: a
command is a short process that allocates a lot (every pulumi_aws class, every
resource under the mock engine) and frees nearly nothing, so collections found
nothing to free and cost a quarter of a plan; `gc.freeze()` at exit spares the
interpreter's last full collection of everything still alive (benchmarks/).
It also tells pydantic not to look for plugins: gpucluster's models use none,
and the search reads the entry points of every installed distribution when the
first model is built (`PYDANTIC_DISABLE_PLUGINS`; set it yourself to keep yours).
`app` loads on first use, so importing this package costs nothing.
"""

from __future__ import annotations

import gc
import os
from typing import Any


def main() -> None:
    """Console-script entry point (`gpucluster`, `python -m gpucluster.cli`)."""
    gc.disable()
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")  # before pydantic builds a model
    try:
        from gpucluster.cli.entry import main as run

        run()
    finally:
        gc.freeze()


def __getattr__(name: str) -> Any:
    if name == "app":
        from gpucluster.cli.entry import app  # the commands registered on it

        return app
    raise AttributeError(f"module 'gpucluster.cli' has no attribute {name!r}")


__all__ = ["app", "main"]
