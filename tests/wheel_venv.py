"""The built wheel in a fresh venv (fixtures shared by test_wheel.py and test_examples.py).

The wheel is built once per test session from a copy of the sources pip needs
(pyproject.toml, README.md, components/), so the build writes nothing into the
checkout. It is installed into a fresh venv without touching the network: the
venv sees the outer venv's dependencies through a `.pth` line, but not the
outer editable install of gpucluster (its own `.pth` file is not processed
from a directory a `.pth` line adds), so only the wheel's copy is importable.

Under pytest-xdist both are made once per test run, not once per worker: the first worker
to need one builds it in the run's shared temporary directory under a file lock, and
the others wait for it and reuse it (the tests only read them).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE_SOURCE = REPO / "components" / "gpucluster"


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """`make(directory)` once per test run, shared by every xdist worker (or just once without xdist)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        directory = tmp_path_factory.mktemp(name)
        make(directory)
        return directory
    shared = tmp_path_factory.getbasetemp().parent  # one per run, the workers' own dirs are inside
    directory, done = shared / name, shared / f"{name}.done"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if `make` fails
        if not done.exists():
            shutil.rmtree(directory, ignore_errors=True)  # what a failed attempt left
            directory.mkdir()
            make(directory)
            done.touch()
    return directory


def build_wheel(dist: Path) -> None:
    source = dist / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "components", source / "components",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    # setuptools is pinned in the lock files, so the build needs no isolated (downloaded) backend.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "-w", str(dist), str(source)], check=True, capture_output=True)
    shutil.rmtree(source)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    (built,) = made_once(tmp_path_factory, "dist", build_wheel).glob("gpucluster-*.whl")
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


def site_packages(python: Path) -> Path:
    return Path(subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, env=clean_env()).stdout.strip())


@pytest.fixture(scope="session")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Venv:
    def make(root: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
        python = root / "bin" / "python"
        # The dependencies: the outer venv's site-packages, appended to sys.path by a .pth line.
        (site_packages(python) / "outer-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        # The outer pip installs into the venv's interpreter (`pip --python`), so the venv needs no pip.
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                        "--no-index", str(wheel)], check=True, capture_output=True, env=clean_env())

    root = made_once(tmp_path_factory, "venv", make)
    python = root / "bin" / "python"
    return Venv(root, python, site_packages(python), root / "bin")
