"""The wheel is the product: one top-level package, its data inside, and it works outside the repository.

The wheel is built once per module from a copy of the sources pip needs
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
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE_SOURCE = REPO / "components" / "gpucluster"


@pytest.fixture(scope="module")
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


@pytest.fixture(scope="module")
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


def test_wheel_installs_only_gpucluster_with_its_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    dist_info = next(n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info"))
    assert {n.split("/")[0] for n in names} == {"gpucluster", dist_info}
    assert zipfile.ZipFile(wheel).read(f"{dist_info}/top_level.txt").decode().split() == ["gpucluster"]
    # Every source file ships: data (.yaml), node scripts (.sh), Lambda sources, scaffold templates.
    expected = {f"gpucluster/{p.relative_to(PACKAGE_SOURCE).as_posix()}" for p in PACKAGE_SOURCE.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}
    assert expected - set(names) == set(), "files under components/gpucluster/ missing from the wheel"
    for path in ("gpucluster/catalog/data/instance_types.yaml", "gpucluster/node/bootstrap.sh",
                 "gpucluster/lambdas/autostop.py", "gpucluster/scaffold/templates/Pulumi.dev.yaml.tmpl",
                 "gpucluster/py.typed"):
        assert path in names
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "gpucluster = gpucluster.cli.commands:main" in entry_points


def test_only_the_wheels_gpucluster_is_importable(venv: Venv, tmp_path: Path) -> None:
    code = ("import importlib.util as u, gpucluster, gpucluster.catalog as c; "
            "print(gpucluster.__file__); print(c.DATA_FILE.is_file()); "
            "print(u.find_spec('components'), u.find_spec('policies'))")
    out = subprocess.run([venv.python, "-c", code], cwd=tmp_path, check=True, capture_output=True,
                         text=True, env=clean_env()).stdout.split("\n")
    assert Path(out[0]).is_relative_to(venv.site_packages), out[0]
    assert out[1:3] == ["True", "None None"]


def test_init_then_plan_dev_outside_the_repository(venv: Venv, tmp_path: Path) -> None:
    gpucluster = str(venv.bin / "gpucluster")
    assert not tmp_path.is_relative_to(REPO)
    created = subprocess.run([gpucluster, "init", "proj"], cwd=tmp_path, capture_output=True, text=True,
                             env=clean_env())
    assert created.returncode == 0, created.stderr
    planned = subprocess.run([gpucluster, "plan", "dev"], cwd=tmp_path / "proj", capture_output=True,
                             text=True, env=clean_env())
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert planned.stdout.startswith("stack dev (us-east-1): ")
    assert "policies: no violations" in planned.stdout
