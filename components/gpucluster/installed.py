"""How this gpucluster was installed (PEP 610's `direct_url.json`), for hints that must match it.

pip writes `direct_url.json` for anything not installed from a package index: a local directory
(an editable checkout too), a wheel or sdist file, a git repository, an archive URL. `gpucluster
init` reads it to name gpucluster in a new project's requirements, and a missing optional extra's
hint (`cost --chart` without matplotlib) says the install command for the same source, so the
hint a wheel install prints is not a checkout's `pip install -e '.[chart]'`. Pure reading: no pip.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

DISTRIBUTION = "gpucluster"


def direct_url() -> dict | None:
    """The installed distribution's `direct_url.json`, or None (installed from an index, or not at all)."""
    try:
        text = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
        found = json.loads(text) if text else None
    except (metadata.PackageNotFoundError, json.JSONDecodeError):
        return None
    return found if isinstance(found, dict) else None


def extra_install_command(extra: str, info: dict | None, cwd: Path | None = None) -> str:
    """The pip command that adds `extra` to gpucluster as it is installed (`info`: its direct_url).

    An editable checkout: `pip install -e '<dir>[extra]'` (`.` when `cwd` is the checkout); a local
    directory or file: the same path, not editable; a git repository or an archive URL: that URL at
    the same commit; a package index: `pip install 'gpucluster[extra]==<version>'` when the version
    is known. Quoted for zsh, which would glob the brackets.
    """
    info = info or {}
    url = info.get("url")
    if isinstance(url, str) and url.startswith("file://"):
        path = Path(url2pathname(urlsplit(url).path))
        shown = "." if cwd is not None and "dir_info" in info and path == cwd else str(path)
        editable = "-e " if (info.get("dir_info") or {}).get("editable") else ""
        return f"pip install {editable}'{shown}[{extra}]'"
    vcs = info.get("vcs_info") or {}
    if isinstance(url, str) and vcs.get("vcs") == "git" and vcs.get("commit_id"):
        return f"pip install '{DISTRIBUTION}[{extra}] @ git+{_without_credentials(url)}@{vcs['commit_id']}'"
    if isinstance(url, str) and url.startswith(("https://", "http://")):
        return f"pip install '{DISTRIBUTION}[{extra}] @ {_without_credentials(url)}'"
    try:
        version = f"=={metadata.version(DISTRIBUTION)}"
    except metadata.PackageNotFoundError:
        version = ""
    return f"pip install '{DISTRIBUTION}[{extra}]{version}'"


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
