"""Where the user's Pulumi project is: its root, its stack files and its policy config.

The CLI works where the user is, as Pulumi does: it looks for `Pulumi.yaml`
from the current directory upward, reads the stack files from the project's
`stackConfigDir` (Pulumi project file reference) and the per-stack policy
config from `policies/config/` beside it. `--stacks-dir` overrides the stack
directory. Every "not found" message says which directory was searched, why
that one, and which stacks it holds. Pure: no Pulumi import, no AWS call.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucluster import catalog
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import MAX_INPUT_BYTES, PROJECT, Finding, SpecError, StackSpec, clip
from gpucluster.spec.files import PROJECT_FILE, find_project_root
from gpucluster.stackfile import load_yaml

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



def price_file_path(start: Path | None = None) -> Path:
    """Where the project's price file is (catalog.PRICE_FILE_NAME beside Pulumi.yaml; outside a project,
    in the current directory): `gpucluster catalog prices` writes it, plan, cost and recommend read it."""
    return (find_project_root(start) or (start or Path.cwd())) / catalog.PRICE_FILE_NAME


def use_project_prices(start: Path | None = None) -> Path | None:
    """Price with the project's own price file when there is one; the file in use, or None."""
    catalog.use_price_file(price_file_path(start))
    return catalog.price_file()


def project_name(stack_file: Path) -> str | None:
    """The `name` of the Pulumi project a stack file belongs to: the Pulumi.yaml nearest above the
    file, else the one above the current directory; None outside any project (or unreadable).

    Part of the deployment's identity, so the CLI reads it where `pulumi up` would.
    """
    for start in (stack_file.resolve().parent, None):
        root = find_project_root(start)
        if root is None:
            continue
        try:
            document = load_yaml((root / PROJECT_FILE).read_text())
        except (OSError, UnicodeDecodeError, SpecError):
            return None
        name = document.get("name") if isinstance(document, dict) else None
        return name if isinstance(name, str) else None
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
    names = stack_names(directory)
    close = difflib.get_close_matches(path.name.removeprefix("Pulumi.").removesuffix(".yaml"), names, n=1)
    hint = f"did you mean {close[0]}? " if close else ""
    return (f"{path}: no such stack file; {hint}searched {directory} ({where.reason}); "
            f"stacks there: {', '.join(names) or 'none'}")


def policy_config_dir(start: Path | None = None) -> Path:
    """`policies/config/` of the project (or of the current directory outside a project)."""
    root = find_project_root(start) or (start or Path.cwd())
    return root / POLICY_CONFIG_DIR


# ------------------------------------------------------------------ stack files


class StackFileError(ValueError):
    """The stack file cannot be found or read (not a config problem inside it)."""


def stack_file(stack: str) -> Path:
    """`dev` -> <stacks dir>/Pulumi.dev.yaml (see `project.stacks_dir`); a / or .yaml makes it a path."""
    if "/" in stack or stack.endswith((".yaml", ".yml")):
        return Path(stack)
    return stacks_dir() / f"Pulumi.{stack}.yaml"


def stack_name(path: Path) -> str:
    """Pulumi.<name>.yaml -> <name>; any other file -> its stem."""
    name = path.name
    for suffix in (".yaml", ".yml"):
        name = name.removesuffix(suffix)
    return name.removeprefix("Pulumi.")


def read_stack_config(path: Path) -> dict[str, Any]:
    """The `config:` map of a stack file, keys namespaced (`gpucluster:` by default).

    StackFileError when the file cannot be read; SpecError (naming the key path and
    line) when its YAML is not a plain, bounded stack file (see `gpucluster.stackfile`).
    """
    where = clip(str(path), 120)
    try:
        if not path.exists():
            raise StackFileError(missing_stack_message(path, by_name=path.parent == stacks_dir()))
        if not path.is_file():  # a directory, FIFO or device would fail late or never end
            raise StackFileError(f"{where}: not a regular file")
        with path.open("rb") as stream:
            data = stream.read(MAX_INPUT_BYTES + 1)
    except OSError as err:  # unreadable, or a name too long for the file system
        raise StackFileError(f"{where}: cannot read it ({err.strerror or err})") from None
    if len(data) > MAX_INPUT_BYTES:
        raise StackFileError(f"{where}: larger than {MAX_INPUT_BYTES // 1024} KiB; not a stack file")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise StackFileError(f"{where}: not UTF-8 text (byte {err.start})") from None
    raw = load_yaml(text)
    if not isinstance(raw, dict) or not isinstance(raw.get("config"), dict):
        raise StackFileError(f"{where}: a stack file needs a top-level `config:` mapping")
    config: dict[str, Any] = {}
    for key, value in raw["config"].items():
        full = key if ":" in key else f"{PROJECT}:{key}"
        if full in config:  # `cluster` and `gpucluster:cluster` name one key
            raise SpecError([Finding(full, f"set twice in config (as {key!r} too); Pulumi rejects it")])
        config[full] = value
    return config


def load_stack(stack: str) -> tuple[str, dict[str, Any], StackSpec]:
    """Read and validate a stack by name or path: (stack name, config map, spec).

    The spec's project is the enclosing Pulumi project's name (`project_name`, default
    `gpucluster`), its organization the stack file's `gpucluster:organization` (default: a
    self-managed backend's): with the stack name, the deployment's identity.
    """
    path = stack_file(stack)
    config = read_stack_config(path)
    name = stack_name(path)
    return name, config, parse_stack_config(config, stack=name, project=project_name(path) or PROJECT)
