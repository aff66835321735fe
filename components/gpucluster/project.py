"""Where the user's Pulumi project is: its root, its stack files and its policy config.

The CLI works where the user is, as Pulumi does: it looks for `Pulumi.yaml`
from the current directory upward, reads the stack files from the project's
`stackConfigDir` (Pulumi project file reference) and the per-stack policy
config from `policies/config/` beside it. `--stacks-dir` overrides the stack
directory. Pure: no Pulumi import, no AWS call.
"""

from __future__ import annotations

from pathlib import Path

from gpucluster.spec import SpecError
from gpucluster.stackfile import load_yaml

PROJECT_FILE = "Pulumi.yaml"
POLICY_CONFIG_DIR = Path("policies") / "config"

_stacks_dir_override: Path | None = None


def use_stacks_dir(path: Path | None) -> None:
    """Read stack files from `path` instead of the project's (the CLI's `--stacks-dir`)."""
    global _stacks_dir_override
    _stacks_dir_override = path


def find_project_root(start: Path | None = None) -> Path | None:
    """The nearest directory, from `start` (default: the current one) upward, holding Pulumi.yaml."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / PROJECT_FILE).is_file():
            return directory
    return None


def stack_config_dir(root: Path) -> Path:
    """The project's `stackConfigDir` (Pulumi.yaml), or the project root when unset or unreadable."""
    try:
        document = load_yaml((root / PROJECT_FILE).read_text())
    except (OSError, UnicodeDecodeError, SpecError):  # bounded like a stack file (gpucluster.stackfile)
        return root
    configured = document.get("stackConfigDir") if isinstance(document, dict) else None
    return root / configured if isinstance(configured, str) and configured else root


def stacks_dir(start: Path | None = None) -> Path:
    """Where stack files are read: `--stacks-dir`, else the project's, else `./stacks` or `.`."""
    if _stacks_dir_override is not None:
        return _stacks_dir_override
    root = find_project_root(start)
    if root is not None:
        return stack_config_dir(root)
    here = start or Path.cwd()
    return here / "stacks" if (here / "stacks").is_dir() else here


def policy_config_dir(start: Path | None = None) -> Path:
    """`policies/config/` of the project (or of the current directory outside a project)."""
    root = find_project_root(start) or (start or Path.cwd())
    return root / POLICY_CONFIG_DIR
