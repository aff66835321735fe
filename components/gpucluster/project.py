"""Where the user's Pulumi project is: its root, its stack files and its policy config.

The CLI works where the user is, as Pulumi does: it looks for `Pulumi.yaml`
from the current directory upward, reads the stack files from the project's
`stackConfigDir` (Pulumi project file reference) and the per-stack policy
config from `policies/config/` beside it. `--stacks-dir` overrides the stack
directory. Every "not found" message says which directory was searched, why
that one, and which stacks it holds. Pure: no Pulumi import, no AWS call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpucluster.spec import SpecError
from gpucluster.stackfile import load_yaml

PROJECT_FILE = "Pulumi.yaml"
POLICY_CONFIG_DIR = Path("policies") / "config"

_stacks_dir_override: Path | None = None


@dataclass(frozen=True)
class StacksLocation:
    """The directory stack files are read from, and why that one (for messages)."""

    path: Path
    reason: str


def use_stacks_dir(path: Path | None) -> None:
    """Read stack files from `path` instead of the project's (the CLI's `--stacks-dir`); None resets."""
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


def locate_stacks(start: Path | None = None) -> StacksLocation:
    """`--stacks-dir`, else the enclosing project's stack directory, else `./stacks`, else `.`."""
    if _stacks_dir_override is not None:
        return StacksLocation(_stacks_dir_override, "given by --stacks-dir")
    root = find_project_root(start)
    if root is not None:
        return StacksLocation(stack_config_dir(root), f"stack directory of {root / PROJECT_FILE}")
    here = start or Path.cwd()
    if (here / "stacks").is_dir():
        return StacksLocation(here / "stacks", f"no {PROJECT_FILE} in {here.resolve()} or above")
    return StacksLocation(here, f"no {PROJECT_FILE} in {here.resolve()} or above, and no ./stacks")


def stacks_dir(start: Path | None = None) -> Path:
    """Where stack files are read (see `locate_stacks`)."""
    return locate_stacks(start).path


def stack_names(directory: Path) -> list[str]:
    """The stacks whose `Pulumi.<name>.yaml` files are in `directory`, sorted."""
    if not directory.is_dir():
        return []
    return sorted(p.name.removeprefix("Pulumi.").removesuffix(".yaml")
                  for p in directory.glob("Pulumi.*.yaml") if p.is_file())


def missing_stack_message(path: Path, by_name: bool) -> str:
    """One line for a stack file that does not exist: what was searched, why there, what is there.

    `by_name`: the user gave a stack name (so the stacks directory was searched),
    not a path to a file.
    """
    if not by_name:
        return f"{path}: no such stack file"
    where = locate_stacks()
    directory = where.path.resolve()
    if not directory.is_dir():
        return (f"{path}: no such stack file; searched {directory} ({where.reason}), "
                "which is not a directory (--stacks-dir DIR to choose another)")
    known = ", ".join(stack_names(directory)) or "none"
    return (f"{path}: no such stack file; searched {directory} ({where.reason}); "
            f"stacks there: {known}")


def policy_config_dir(start: Path | None = None) -> Path:
    """`policies/config/` of the project (or of the current directory outside a project)."""
    root = find_project_root(start) or (start or Path.cwd())
    return root / POLICY_CONFIG_DIR
