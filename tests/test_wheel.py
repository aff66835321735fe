"""The wheel is the product: one top-level package, its data inside, and it works outside the repository."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from wheel_venv import PACKAGE_SOURCE, REPO, Venv, clean_env, site_packages


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
    assert "gpucluster = gpucluster.cli:main" in entry_points


def test_only_the_wheels_gpucluster_is_importable(venv: Venv, tmp_path: Path) -> None:
    code = ("import importlib.util as u, gpucluster, gpucluster.catalog as c; "
            "print(gpucluster.__file__); print(c.DATA_FILE.is_file()); "
            "print(u.find_spec('components'), u.find_spec('policies'))")
    out = subprocess.run([venv.python, "-c", code], cwd=tmp_path, check=True, capture_output=True,
                         text=True, env=clean_env()).stdout.split("\n")
    assert Path(out[0]).is_relative_to(venv.site_packages), out[0]
    assert out[1:3] == ["True", "None None"]


def test_init_then_install_its_requirements_then_plan_dev_outside_the_repository(
        venv: Venv, wheel: Path, tmp_path: Path) -> None:
    """Issue 25's "Done when": wheel -> venv -> `gpucluster init demo` -> `pip install -r
    requirements.txt` (into the project's own .venv, as `pulumi install` does) resolving gpucluster
    from the same wheel -> `gpucluster plan dev` exit 0, no boundary or break-glass role in the stack.

    The requirement is a version range a teammate can install (issue 37: never the wheel's path on
    this machine), with a comment naming where this one came from. Offline: the wheel's directory
    stands in for the package index (`--no-index --find-links`), and the other dependencies are the
    outer venv's (a .pth line), so pip checks them and downloads nothing.
    """
    assert not tmp_path.is_relative_to(REPO)
    created = subprocess.run([str(venv.bin / "gpucluster"), "init", "demo"], cwd=tmp_path,
                             capture_output=True, text=True, env=clean_env())
    assert created.returncode == 0, created.stderr
    demo = tmp_path / "demo"
    lines = (demo / "requirements.txt").read_text().splitlines()
    version = wheel.name.split("-")[1]
    assert lines[-1] == f"gpucluster>={version},<0.{int(version.split('.')[1]) + 1}", lines
    assert "file://" not in "\n".join(lines) and any("a local file" in line for line in lines), lines
    stack = (demo / "stacks" / "Pulumi.dev.yaml").read_text()
    assert "permissions_boundary" not in stack and "break_glass_role" not in stack

    project_venv = demo / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project_venv)], check=True)
    python = project_venv / "bin" / "python"
    (site_packages(python) / "outer-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
           "--find-links", str(wheel.parent)]
    resolved = subprocess.run([*pip, "-r", "requirements.txt"], cwd=demo, capture_output=True, text=True,
                              env=clean_env())
    assert resolved.returncode == 0, resolved.stdout + resolved.stderr  # the range and its dependencies
    # The outer venv's gpucluster (a .pth away) satisfies the range too: install the wheel over it, as a
    # teammate's fresh venv would get it from the index.
    installed = subprocess.run([*pip, "--force-reinstall", "--no-deps", "-r", "requirements.txt"], cwd=demo,
                               capture_output=True, text=True, env=clean_env())
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "Successfully installed gpucluster" in installed.stdout
    where = subprocess.run([python, "-c", "import gpucluster; print(gpucluster.__file__)"], cwd=demo,
                           check=True, capture_output=True, text=True, env=clean_env()).stdout.strip()
    assert Path(where).is_relative_to(site_packages(python)), where

    planned = subprocess.run([str(project_venv / "bin" / "gpucluster"), "plan", "dev"], cwd=demo,
                             capture_output=True, text=True, env=clean_env())
    assert planned.returncode == 0, planned.stdout + planned.stderr
    assert planned.stdout.startswith("stack dev (us-east-1): ")
    assert "policies: no violations" in planned.stdout
