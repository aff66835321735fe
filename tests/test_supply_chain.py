"""Supply chain: every dependency is pinned and hashed, and every install checks the hashes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
LOCKS = ["requirements.lock", "requirements-dev.lock"]
HASHED_INSTALL = re.compile(r"pip install -q --require-hashes -r (requirements(?:-dev)?\.lock)")
SELF_INSTALL = "pip install -q --no-deps --no-build-isolation -e ."


def requirements(text: str) -> dict[str, tuple[str, list[str]]]:
    """`name -> (line, hashes)` of a pip requirements file, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found: dict[str, tuple[str, list[str]]] = {}
    for raw in joined.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        spec = line.split()[0]
        name = re.split(r"[=<>!~\[; ]", spec, maxsplit=1)[0].lower().replace("_", "-")
        found[name] = (line, re.findall(r"--hash=sha256:([0-9a-f]{64})", line))
    return found


def unpinned_or_unhashed(text: str) -> list[str]:
    """The lines pip's hash-checking mode would refuse, or that name no single version."""
    bad = []
    for name, (line, hashes) in requirements(text).items():
        if line.startswith("-") or not re.match(rf"^{re.escape(name)}(\[[\w,-]+\])?==[\w.+!-]+(\s|$)",
                                                line, re.IGNORECASE) or not hashes:
            bad.append(name)
    return bad


@pytest.mark.parametrize("lock", LOCKS)
def test_every_locked_dependency_is_pinned_and_hashed(lock: str) -> None:
    text = (REPO / lock).read_text()
    assert len(requirements(text)) > 30
    assert unpinned_or_unhashed(text) == []
    assert "--generate-hashes" in text.splitlines()[1], "regenerate with the command in the header"


def test_the_check_catches_an_unpinned_or_unhashed_line() -> None:
    good = "boto3==1.44.5 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    assert unpinned_or_unhashed(good) == []
    assert unpinned_or_unhashed(good + "requests==2.34.2\n") == ["requests"]
    assert unpinned_or_unhashed(good + "rich>=15 --hash=sha256:" + "b" * 64 + "\n") == ["rich"]
    assert unpinned_or_unhashed(good + "-e .\n") == ["-e"]


def test_pyproject_pins_match_the_locks() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = requirements((REPO / "requirements.lock").read_text())
    dev = requirements((REPO / "requirements-dev.lock").read_text())
    extras = [dep for group in project["optional-dependencies"].values() for dep in group]
    for dep, lock in [(d, runtime) for d in project["dependencies"]] + [(d, dev) for d in extras]:
        name, version = re.fullmatch(r"([\w-]+)(?:\[[\w,]+\])?==([\w.]+)", dep).groups()  # type: ignore[union-attr]
        assert lock[name.lower()][0].split()[0].endswith(f"=={version}"), dep
    # the build backend `--no-build-isolation` uses comes from the locks, hashed
    for lock in (runtime, dev):
        assert "setuptools" in lock
    setuptools = int(runtime["setuptools"][0].split("==")[1].split(".")[0])
    assert setuptools >= 68  # pyproject's build-system requires setuptools>=68


CONSUMER_INSTALL = re.compile(r'pip install "gpucluster @ git\+https://|pip install dist/gpucluster-')


def _commands() -> list[tuple[str, str]]:
    """Every shell command that installs Python packages, with where it is."""
    found = []
    readme = (REPO / "README.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", readme, re.DOTALL):
        # Installing gpucluster itself into a user's own program is that program's lock to pin,
        # not this repository's environment: those lines are the one exception.
        found += [("README.md", line) for line in block.splitlines()
                  if "pip install" in line and not CONSUMER_INSTALL.search(line)]
    found += [(".ci/run", line) for line in (REPO / ".ci" / "run").read_text().splitlines()
              if "pip install" in line]
    for workflow in sorted((REPO / ".github" / "workflows").glob("*.yml")):
        for job in yaml.safe_load(workflow.read_text())["jobs"].values():
            found += [(workflow.name, step["run"]) for step in job.get("steps", [])
                      if "pip install" in step.get("run", "")]
    return found


def test_every_install_checks_hashes_then_installs_the_project_without_dependencies() -> None:
    commands = _commands()
    assert {where for where, _ in commands} == {"README.md", ".ci/run", "pr.yml", "deploy.yml",
                                                "deploy-stack.yml"}
    for where, command in commands:
        installs = [part.strip() for part in command.split("&&") if "pip install" in part]
        assert installs, (where, command)
        for part in installs:
            assert HASHED_INSTALL.search(part) or part.endswith(SELF_INSTALL), (where, part)
        assert HASHED_INSTALL.search(installs[0]), f"{where}: the locked set comes first"
