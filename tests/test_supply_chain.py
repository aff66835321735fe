"""Supply chain: every dependency is pinned and hashed, and every install checks the hashes."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
LOCKS = ["requirements.lock", "requirements-dev.lock", "requirements-lowest.lock", "requirements-uv.lock"]
# Every install starts with pip installing the installer, uv, from its own hashed lock; uv then installs a
# lock in hash-checking mode into the venv it is told (never one an activated shell happens to name).
INSTALLER_INSTALL = ".venv/bin/pip install -q --require-hashes -r requirements-uv.lock"
UV = ".venv/bin/uv pip install -q --python .venv/bin/python"
HASHED_INSTALL = re.compile(re.escape(UV) + r" --require-hashes -r (requirements(?:-dev|-lowest)?\.lock)$")
SELF_INSTALL = UV + " --no-deps --no-build-isolation -e ."
# The release workflow tests the wheel it built (after the hashed lock), nothing from an index.
WHEEL_INSTALL = "pip install -q --no-deps --no-index dist/gpucluster-*.whl"


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
    if lock == "requirements-uv.lock":
        assert set(requirements(text)) == {"uv"}, "the installer's lock holds the installer alone"
    else:
        assert len(requirements(text)) > 30
    assert unpinned_or_unhashed(text) == []
    assert "--generate-hashes" in text.splitlines()[1], "regenerate with the command in the header"


def test_the_check_catches_an_unpinned_or_unhashed_line() -> None:
    good = "boto3==1.44.5 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    assert unpinned_or_unhashed(good) == []
    assert unpinned_or_unhashed(good + "requests==2.34.2\n") == ["requests"]
    assert unpinned_or_unhashed(good + "rich>=15 --hash=sha256:" + "b" * 64 + "\n") == ["rich"]
    assert unpinned_or_unhashed(good + "-e .\n") == ["-e"]


def _declared() -> list[tuple[str, Requirement]]:
    """Every dependency pyproject declares, with its group ("" for the runtime ones)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    found = [("", Requirement(d)) for d in project["dependencies"]]
    found += [(group, Requirement(d))
              for group, deps in project["optional-dependencies"].items() for d in deps]
    found += [(group, Requirement(d)) for group, deps in pyproject["dependency-groups"].items() for d in deps]
    return found


def test_pyproject_declares_ranges_not_pins() -> None:
    """A library installs beside others: a lower bound and the next major (minor for 0.x) as the top."""
    for group, req in _declared():
        operators = sorted(s.operator for s in req.specifier)
        assert operators == ["<", ">="], (group, str(req))
        upper = Version(next(s.version for s in req.specifier if s.operator == "<"))
        lower = Version(next(s.version for s in req.specifier if s.operator == ">="))
        assert upper.release == ((lower.major + 1,) if lower.major else (0, lower.minor + 1)), str(req)


def test_the_locks_pin_versions_inside_pyprojects_ranges() -> None:
    runtime = requirements((REPO / "requirements.lock").read_text())
    dev = requirements((REPO / "requirements-dev.lock").read_text())
    installer = requirements((REPO / "requirements-uv.lock").read_text())
    assert {group for group, _ in _declared()} == {"", "dev", "chart", "docs", "installer"}
    for group, req in _declared():
        lock = {"": runtime, "installer": installer}.get(group, dev)
        for where in ([runtime, dev] if group == "" else [lock]):
            pinned = where[req.name.lower()][0].split()[0].split("==")[1]
            assert req.specifier.contains(pinned), (str(req), pinned)
    # the build backend `--no-build-isolation` uses comes from the locks, hashed
    for lock in (runtime, dev):
        assert "setuptools" in lock
    setuptools = int(runtime["setuptools"][0].split("==")[1].split(".")[0])
    assert setuptools >= 68  # pyproject's build-system requires setuptools>=68


def test_the_lowest_lock_holds_every_runtime_dependency_at_its_lower_bound() -> None:
    """What the `lowest` CI job tests is what pyproject promises works: every lower bound, exactly."""
    lowest = requirements((REPO / "requirements-lowest.lock").read_text())
    assert "--resolution lowest-direct" in (REPO / "requirements-lowest.lock").read_text().splitlines()[1]
    for group, req in _declared():
        if group in ("", "dev"):
            bound = next(s.version for s in req.specifier if s.operator == ">=")
            assert lowest[req.name.lower()][0].split()[0].split("==")[1] == bound, str(req)
    assert lowest["pulumi"][0].split()[0] != requirements((REPO / "requirements.lock").read_text())[
        "pulumi"][0].split()[0], "the lowest job tests a pulumi other than the locked one"


CONSUMER_INSTALL = re.compile(r'pip install "gpucluster @ git\+https://'
                              r'|pip install (dist/)?gpucluster-[\w.]+-py3-none-any\.whl'
                              r'|pip install -r requirements\.txt')


def _commands() -> list[tuple[str, str]]:
    """Every shell command that installs Python packages, with where it is."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.DOTALL):
            block = re.sub(r"\s*\\\n\s*", " ", block)  # a command wrapped with `\` is one line
            # Installing gpucluster itself into a user's own program (a wheel, a git tag, the
            # requirements.txt `init` writes) is that program's to pin, not this repository's
            # environment: those lines are the one exception.
            found += [(page.name, line) for line in block.splitlines()
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
    assert {where for where, _ in commands} == {"README.md", "getting-started.md", "development.md",
                                                ".ci/run", "pr.yml", "deploy.yml", "deploy-stack.yml",
                                                "release.yml"}
    for where, command in commands:
        installs = [part.strip() for part in re.split(r"&&|\n", command) if "pip install" in part]
        assert installs, (where, command)
        assert installs[0].endswith(INSTALLER_INSTALL), f"{where}: the hashed installer comes first"
        assert len(installs) > 1 and HASHED_INSTALL.search(installs[1]), f"{where}: then the locked set"
        for part in installs[1:]:
            assert (HASHED_INSTALL.search(part) or part.endswith(SELF_INSTALL)
                    or (where == "release.yml" and part.endswith(WHEEL_INSTALL))), (where, part)


def test_the_install_check_refuses_an_unhashed_or_untargeted_install() -> None:
    """The command check above is only as good as its patterns: what they must refuse, they do."""
    assert HASHED_INSTALL.search(f"{UV} --require-hashes -r requirements-dev.lock")
    for part in (".venv/bin/uv pip install -q -r requirements-dev.lock",  # no hash check
                 ".venv/bin/uv pip install -q --require-hashes -r requirements-dev.lock",  # into any venv
                 f"{UV} --require-hashes -r requirements-dev.lock moto",  # one more, unpinned
                 ".venv/bin/pip install -q --require-hashes -r requirements-dev.lock"):  # not the installer
        assert not HASHED_INSTALL.search(part), part
    assert not f"{UV} --no-deps -e .".endswith(SELF_INSTALL)
