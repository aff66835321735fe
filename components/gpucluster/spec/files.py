"""Files of the user's project that a stack file names (`setup_script`, `files[].source`): where the
project is (the directory holding Pulumi.yaml) and how a file of it is read.

Pure file-system reads; never imports Pulumi, AWS or anything above `gpucluster.spec`.
"""

from __future__ import annotations

from pathlib import Path

PROJECT_FILE = "Pulumi.yaml"


def find_project_root(start: Path | None = None) -> Path | None:
    """The nearest directory, from `start` (default: the current one) upward, holding Pulumi.yaml."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        if (directory / PROJECT_FILE).is_file():
            return directory
    return None


class ProjectFileError(ValueError):
    """A `source` or `setup_script` file of the project cannot be read."""


def read_project_file(relative: str) -> str:
    """The text of a file of the user's project: relative to the directory holding Pulumi.yaml.

    Pulumi runs the program there; `gpucluster plan` finds it from the current directory up.
    """
    root = find_project_root() or Path.cwd()
    path = root / relative
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProjectFileError(f"no such file {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ProjectFileError(f"cannot read {path} as UTF-8 text ({err})") from None
