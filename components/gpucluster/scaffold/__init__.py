"""`gpucluster init`: a new Pulumi project that uses the installed gpucluster package.

The project is what this repository's root is, minus the package: a
Pulumi.yaml (Python, pip, `.venv`, `stackConfigDir: stacks`), a `__main__.py`
that runs `gpucluster.program`, a requirements.txt naming gpucluster, a small
dev stack, the CrossGuard policy pack entry and a README with next steps, so
`gpucluster plan dev` plans it at once. The templates ship inside the package
(`templates/*.tmpl`; `.tmpl` so pip does not byte-compile them or pytest
collect them) and are filled with `string.Template`.
"""

from __future__ import annotations

import json
import re
from importlib import metadata, resources
from pathlib import Path
from string import Template
from urllib.parse import urlsplit, urlunsplit

DISTRIBUTION = "gpucluster"

# Project file -> template (templates/<name>).
TEMPLATES: dict[str, str] = {
    "Pulumi.yaml": "Pulumi.yaml.tmpl",
    "__main__.py": "main.py.tmpl",
    "requirements.txt": "requirements.txt.tmpl",
    ".gitignore": "gitignore.tmpl",
    "README.md": "README.md.tmpl",
    "stacks/Pulumi.dev.yaml": "Pulumi.dev.yaml.tmpl",
    "policies/PulumiPolicy.yaml": "PulumiPolicy.yaml.tmpl",
    "policies/__main__.py": "policy_main.py.tmpl",
    "policies/config/README.md": "policy_config_README.md.tmpl",
}


class ScaffoldError(ValueError):
    """The project cannot be created there (one line, for the CLI)."""


def installed_version() -> str:
    """The installed gpucluster's version (its distribution metadata)."""
    return metadata.version(DISTRIBUTION)


def requirement_line(version: str, direct_url: dict | None) -> str:
    """How the new project's requirements.txt names gpucluster.

    Installed from git (PEP 610 `direct_url.json` with `vcs_info`): that
    repository at that commit, without any credentials in the URL. Otherwise
    the installed version from your package index.
    """
    vcs = (direct_url or {}).get("vcs_info") or {}
    url = (direct_url or {}).get("url")
    if vcs.get("vcs") == "git" and url and vcs.get("commit_id"):
        parts = urlsplit(url)
        clean = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        return f"{DISTRIBUTION} @ git+{clean}@{vcs['commit_id']}"
    return f"{DISTRIBUTION}=={version}"


def _installed_direct_url() -> dict | None:
    try:
        text = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        return json.loads(text) if text else None
    except (metadata.PackageNotFoundError, json.JSONDecodeError):
        return None


def project_name(directory: Path) -> str:
    """A Pulumi project name from the directory's name (letters, digits, `-`, `_`, `.`)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", directory.resolve().name).strip("-.")
    return name or "gpucluster-project"


def render(name: str, version: str, requirement: str) -> dict[str, str]:
    """Every project file's text (project path -> text)."""
    values = {"name": name, "version": version, "requirement": requirement}
    folder = resources.files(__package__).joinpath("templates")
    return {path: Template(folder.joinpath(template).read_text()).substitute(values)
            for path, template in TEMPLATES.items()}


def create_project(directory: Path) -> list[Path]:
    """Write a new project into `directory` (created if missing, else it must be empty).

    Returns the files written. ScaffoldError, before anything is written, when
    `directory` is a file or is not empty.
    """
    if directory.exists() and not directory.is_dir():
        raise ScaffoldError(f"{directory} exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()):
        raise ScaffoldError(f"{directory} is not empty; give a new or empty directory")
    version = installed_version()
    files = render(project_name(directory), version, requirement_line(version, _installed_direct_url()))
    written = []
    try:
        for relative, text in files.items():
            path = directory / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
    except OSError as err:
        raise ScaffoldError(f"cannot write {err.filename}: {err.strerror}") from None
    return written
