"""The built wheel in a fresh venv (fixtures shared by test_wheel.py and test_examples.py).

The wheel is built once per test session from a copy of the sources pip needs
(pyproject.toml, README.md, components/), so the build writes nothing into the
checkout. It is installed into a fresh venv without touching the network: the
venv sees the outer venv's dependencies through a `.pth` line, but not the
outer editable install of gpucluster (its own `.pth` file is not processed
from a directory a `.pth` line adds), so only the wheel's copy is importable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE_SOURCE = REPO / "components" / "gpucluster"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "components", source / "components",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    dist = tmp_path_factory.mktemp("dist")
    # setuptools is pinned in the lock files, so the build needs no isolated (downloaded) backend.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(dist), str(source)], check=True, capture_output=True)
    (built,) = dist.glob("gpucluster-*.whl")
    return built


@dataclass(frozen=True)
class Venv:
    root: Path
    python: Path
    site_packages: Path
    bin: Path


def clean_env() -> dict[str, str]:
    """The environment of a user's shell: nothing that points Python at this checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


@pytest.fixture(scope="session")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, env=clean_env()).stdout.strip())
    # The dependencies: the outer venv's site-packages, appended to sys.path by a .pth line.
    (site / "outer-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # The outer pip installs into the venv's interpreter (`pip --python`), so the venv needs no pip.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    "--no-index", str(wheel)], check=True, capture_output=True, env=clean_env())
    return Venv(root, python, site, root / "bin")
