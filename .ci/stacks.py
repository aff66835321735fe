"""The stacks CI plans, previews and deploys: every stacks/Pulumi.<name>.yaml, in deploy waves.

A new stack is a file: pr.yml previews every stack this finds and deploy.yml deploys them in
three waves, by the stack's own `environment` tag (`gpucluster:cluster` -> `tags.environment`):
first every stack that is neither staging nor prod (dev, qa, ...), then the staging stacks,
then the prod stacks; the stacks of one wave deploy side by side, each in its own GitHub
environment. A stack file that cannot be read goes in the first wave (its plan gate stops it).

    python .ci/stacks.py                  # {"all": [...], "first": [...], "staging": [...], "prod": [...]}
    python .ci/stacks.py --github-output  # the same as name=value lines for $GITHUB_OUTPUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gpucluster.project import StackFileError, read_stack_config, stack_names
from gpucluster.spec import SpecError

REPO = Path(__file__).resolve().parent.parent
STACKS = REPO / "stacks"
WAVES = ("first", "staging", "prod")
"""Deploy order; a stack's wave is its environment tag when that names a later wave."""


def environment(stack: str, directory: Path = STACKS) -> str | None:
    """The stack file's `environment` tag, None when it has none or cannot be read."""
    try:
        config = read_stack_config(directory / f"Pulumi.{stack}.yaml")
    except (StackFileError, SpecError):
        return None
    cluster: Any = config.get("gpucluster:cluster")
    tags = cluster.get("tags") if isinstance(cluster, dict) else None
    value = tags.get("environment") if isinstance(tags, dict) else None
    return value if isinstance(value, str) else None


def waves(directory: Path = STACKS) -> dict[str, list[str]]:
    """Every stack in `directory`, and the stacks of each deploy wave (names sorted)."""
    out: dict[str, list[str]] = {"all": stack_names(directory), **{wave: [] for wave in WAVES}}
    for stack in out["all"]:
        env = environment(stack, directory)
        out[env if env in WAVES[1:] else WAVES[0]].append(stack)
    return out


def main(argv: list[str]) -> int:
    found = waves()
    if argv == ["--github-output"]:
        print("\n".join(f"{key}={json.dumps(value)}" for key, value in found.items()))
    elif not argv:
        print(json.dumps(found))
    else:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
