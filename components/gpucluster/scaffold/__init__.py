"""`gpucluster init`: a new Pulumi project that uses the installed gpucluster package.

The project is what this repository's root is, minus the package: a
Pulumi.yaml (Python, pip, `.venv`, `stackConfigDir: stacks`), a `__main__.py`
that runs `gpucluster.program`, a requirements.txt naming gpucluster so that a teammate or CI can install it
too (`pip install -r requirements.txt`, what `pulumi install` runs: a version
range, a git commit or an https URL, never a path on this machine), a small dev stack, the
CrossGuard policy pack entry with the dev environment's limits spelled out
(`policies/config/dev.json`) and a README with the next five commands, so
`gpucluster plan dev` plans it at once and `pulumi up` deploys it as generated.

The default stack names no permissions boundary and no break-glass role: both
exist only after an administrator runs the bootstrap script, and IAM refuses
`pulumi up` for a boundary that does not exist. `--hardened` adds them, ships
the script (`infra/bootstrap_state.py`: the package ships the repository's
infra/bootstrap-state/bootstrap_state.py) and says in the README what to run
first. The templates ship inside the package (`templates/*.tmpl`; `.tmpl` so
pip does not byte-compile them or pytest collect them) and are filled with
`string.Template` (the bootstrap script is copied as it is).

`--scheduler slurm` adds `gpucluster:scheduler: {type: slurm}` to the dev stack (its node group is
one AWS PCS can launch: all spot, no warm pool) and the Slurm steps (log in, submit, watch) to the
README. `--scheduler eks` adds `{type: eks}` (an EKS cluster the same node group joins, Kueue queues for a
team) and the Kubernetes steps (kubeconfig, submit through Kueue) to the README.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata, resources
from pathlib import Path
from string import Template
from urllib.parse import urlsplit, urlunsplit
from urllib.request import url2pathname

from gpucluster import installed
from gpucluster.installed import DISTRIBUTION

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
# What `--hardened` adds, copied without substitution (project file -> template).
HARDENED_FILES: dict[str, str] = {"infra/bootstrap_state.py": "bootstrap_state.py.tmpl"}

# The stack-file lines `--hardened` adds under gpucluster:cluster (the names the bootstrap script's
# defaults and the README use).
HARDENED_CLUSTER = """\
    # Made by infra/bootstrap_state.py (an administrator runs it once per account, see README.md):
    # the stack's roles carry this boundary, and only the break-glass role deletes dataset versions
    # or buckets. IAM refuses `pulumi up` while either does not exist; `gpucluster doctor dev` checks.
    permissions_boundary: gpucluster-workload-boundary
    break_glass_role: acme-break-glass
"""


# The stack-file section `--scheduler slurm` adds (spec/models.py SchedulerConfig; the node group above
# is all spot with no warm pool, which AWS PCS can launch: spec/scheduler.py).
SLURM_SCHEDULER = """
  # Slurm on AWS Parallel Computing Service: a queue (Slurm partition) per node group, named as the
  # group, and a login node you reach with `gpucluster login dev`. See the Slurm guide.
  gpucluster:scheduler:
    type: slurm
    slurm_version: "25.05"            # what the PCS cluster runs; the AMI must carry the same
    accounting: true                  # sacct, `gpucluster spend dev --by user`; fixed at creation
    ami_id: AMI_ID   # --ami-id: an AMI with the AWS PCS agent and Slurm 25.05 (login and nodes)
    # login: {instance_type: m7i.large, count: 1}   # the default login node: submits jobs, no GPUs
"""

# The stack-file section `--scheduler eks` adds (spec/models.py SchedulerConfig; the node group above is all
# spot, one purchase option, with no warm pool, as an EKS stack's groups must be: spec/scheduler.py).
EKS_SCHEDULER = """
  # Kubernetes on Amazon EKS: the node group above joins the cluster as a self-managed node group, jobs
  # queue in Kueue (a LocalQueue per team namespace), a small on-demand system node group runs the
  # controllers. See README.md "Jobs on Kubernetes".
  gpucluster:scheduler:
    type: eks
    # kubernetes_version: "1.35"      # default: the newest version in EKS standard support
    endpoint_public: false            # the API endpoint stays private: reach it from the VPC (SSM, VPN)
    teams: [ml]                       # a namespace with a Kueue LocalQueue each
    max_run_minutes: 720              # a job's default maximum run time
    system_nodes: {instance_type: m7i.large, count: 2}
"""

SCHEDULERS = ("none", "slurm", "eks")
DEV_BUDGET_USD = 700
"""The dev stack's monthly budget (templates/Pulumi.dev.yaml.tmpl)."""
SLURM_DEV_BUDGET_USD = 1300
"""A Slurm dev stack's: the launcher's dev group at its maximum plus AWS PCS's fixed monthly fees."""
EKS_DEV_BUDGET_USD = 950
"""An EKS dev stack's: the launcher's dev group plus the EKS control plane and two system nodes (about
$220 a month at the cost model's EKS prices)."""
AMI_PATTERN = re.compile(r"ami-[0-9a-f]{8,17}")


def slurm_scheduler(ami_id: str) -> str:
    """The Slurm section of the dev stack, with the AMI its login and compute nodes boot."""
    return SLURM_SCHEDULER.replace("AMI_ID", ami_id, 1)


class ScaffoldError(ValueError):
    """The project cannot be created there (one line, for the CLI)."""


def installed_version() -> str:
    """The installed gpucluster's version (its distribution metadata)."""
    return metadata.version(DISTRIBUTION)


@dataclass(frozen=True)
class Checkout:
    """A git checkout's shared source: its `origin` remote (credentials removed) and the commit at HEAD."""

    url: str
    commit: str


def local_checkout(path: str) -> Checkout | None:
    """The git checkout at `path` as others can fetch it, or None (no git, no checkout, no remote
    outside this machine). Asks `git` (`rev-parse HEAD`, `remote get-url origin`), briefly."""
    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", "-C", path, *args], capture_output=True, text=True, timeout=10,
                                  check=False)
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    commit, origin = git("rev-parse", "HEAD"), git("remote", "get-url", "origin")
    scp = re.fullmatch(r"([\w.-]+@)?([\w.-]+):(?!//)(.+)", origin)  # git@host:owner/repo.git
    if scp:
        origin = f"ssh://{scp.group(1) or ''}{scp.group(2)}/{scp.group(3)}"
    parts = urlsplit(origin)
    shared = parts.scheme in ("https", "http", "ssh") and bool(parts.netloc)
    if not re.fullmatch(r"[0-9a-f]{40}", commit) or not shared:
        return None
    user, _, host = parts.netloc.rpartition("@")
    netloc = f"{user}@{host}" if parts.scheme == "ssh" and user and ":" not in user else host
    return Checkout(urlunsplit(parts._replace(netloc=netloc)), commit)


def requirement_line(version: str, direct_url: dict | None,
                     checkout: Callable[[str], Checkout | None] = local_checkout) -> str:
    """How the new project's requirements.txt names gpucluster: something a teammate or CI installs too.

    From PEP 610's `direct_url.json` (pip writes it for anything not installed
    from an index): a git repository at the commit installed, or an archive at
    an https URL (credentials stripped from both). A local directory that is a
    git checkout with a remote (gpucluster run from a checkout, editable or not)
    becomes its `origin` at the commit checked out (`checkout` asks git). Any
    other local source, a wheel or sdist file or a directory no one else can
    reach, is never named by its path (a `file://` URL fails on every other
    machine): like an install from a package index it becomes a compatible-release
    range, the same major version (the same minor while 0.x, semantic
    versioning), at least this version; `requirement_note` says so in the file.
    """
    info = direct_url or {}
    vcs = info.get("vcs_info") or {}
    url = info.get("url")
    if vcs.get("vcs") == "git" and url and vcs.get("commit_id"):
        parts = urlsplit(url)
        clean = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        return f"{DISTRIBUTION} @ git+{clean}@{vcs['commit_id']}"
    if isinstance(url, str) and url.startswith(("https://", "http://")) and "archive_info" in info:
        parts = urlsplit(url)
        return f"{DISTRIBUTION} @ {urlunsplit(parts._replace(netloc=parts.netloc.rpartition('@')[2]))}"
    if isinstance(url, str) and url.startswith("file://") and "dir_info" in info:
        found = checkout(url2pathname(urlsplit(url).path))
        if found is not None:
            return f"{DISTRIBUTION} @ git+{found.url}@{found.commit}"
    return f"{DISTRIBUTION}{version_range(version)}"


def requirement_note(version: str, direct_url: dict | None, line: str) -> str:
    """Comment lines above the requirement when this machine's gpucluster came from a local source
    that `line` does not name (so nobody wonders why the project installs something else)."""
    info = direct_url or {}
    url = info.get("url")
    if not (isinstance(url, str) and url.startswith("file://")):
        return ""
    where = url2pathname(urlsplit(url).path)
    if " @ git+" in line:
        return (f"# gpucluster {version} was installed here from the checkout {where}: named below\n"
                "# by its origin remote at the commit checked out (push it first), for teammates and CI.\n")
    kind = "a local file" if "archive_info" in info else "a local directory no one else can reach"
    return (f"# gpucluster {version} was installed here from {kind} ({where}); a teammate or CI installs\n"
            "# the release below from the package index. To use a build of your own, name it here\n"
            "# (a URL others can reach, or git+https://host/owner/repo@<commit>).\n")


def version_range(version: str) -> str:
    """`>=1.4.2,<2` for 1.4.2; `>=0.3.1,<0.4` while 0.x (a minor release may break then)."""
    numbers = [int(n) for n in re.findall(r"\d+", version.split("+")[0])[:2]] + [0, 0]
    major, minor = numbers[0], numbers[1]
    upper = f"{major + 1}" if major else f"0.{minor + 1}"
    return f">={version},<{upper}"


def project_name(directory: Path) -> str:
    """A Pulumi project name from the directory's name (letters, digits, `-`, `_`, `.`)."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", directory.resolve().name).strip("-.")
    return name or "gpucluster-project"


def dev_policy_config() -> str:
    """policies/config/dev.json: the dev environment's limits spelled out (the built-in defaults)."""
    from gpucluster.policy.rules.capacity import DEFAULT_ENVIRONMENTS

    document = {"environment-limits": {"enforcementLevel": "mandatory",
                                       "environments": {"dev": DEFAULT_ENVIRONMENTS["dev"]}}}
    return json.dumps(document, indent=2) + "\n"


def render(name: str, version: str, requirement: str, *, hardened: bool = False,
           scheduler: str = "none", ami_id: str | None = None) -> dict[str, str]:
    """Every project file's text (project path -> text); `scheduler` slurm adds the Slurm section.

    A Slurm stack's nodes boot an AMI carrying the AWS PCS agent and Slurm (spec/scheduler.py): the
    scaffold asks for it rather than writing a placeholder that would validate and not deploy.
    """
    if scheduler not in SCHEDULERS:
        raise ScaffoldError(f"--scheduler: must be none, slurm or eks, got {scheduler!r}")
    slurm, eks = scheduler == "slurm", scheduler == "eks"
    if slurm and ami_id is None:
        raise ScaffoldError("--scheduler slurm needs --ami-id: an AMI with the AWS PCS agent and Slurm 25.05 "
                            "(docs/guides/slurm.md says where to get one)")
    if ami_id is not None and not slurm:
        raise ScaffoldError("--ami-id: only used with --scheduler slurm")
    if ami_id is not None and not AMI_PATTERN.fullmatch(ami_id):
        raise ScaffoldError(f"--ami-id: must be an AMI id like ami-0abc12345def67890, got {ami_id!r}")
    values = {"name": name, "version": version, "requirement": requirement,
              "hardening": HARDENED_CLUSTER if hardened else "",
              "hardened_steps": _template("README.hardened.md.tmpl").strip() + "\n\n" if hardened else "",
              "scheduler": slurm_scheduler(ami_id) if slurm and ami_id else EKS_SCHEDULER if eks else "",
              # The PCS controller, its accounting and the login node run all month (about $550 of it at
              # the cost model's PCS prices): the launcher's budget would be over before a job runs.
              "budget": f"{SLURM_DEV_BUDGET_USD}           # with the PCS controller, accounting and login "
                        "node" if slurm
              else f"{EKS_DEV_BUDGET_USD}            # with the EKS control plane and system nodes" if eks
              else str(DEV_BUDGET_USD),
              "slurm_steps": "\n" + _template(f"README.{scheduler}.md.tmpl").strip() + "\n"
                             if slurm or eks else ""}
    files = {path: Template(_template(template)).substitute(values) for path, template in TEMPLATES.items()}
    files["policies/config/dev.json"] = dev_policy_config()
    if hardened:
        files.update({path: _template(template) for path, template in HARDENED_FILES.items()})
    return files


def _template(name: str) -> str:
    return resources.files(__package__).joinpath("templates", name).read_text()


def create_project(directory: Path, *, hardened: bool = False, scheduler: str = "none",
                   ami_id: str | None = None) -> list[Path]:
    """Write a new project into `directory` (created if missing, else it must be empty).

    Returns the files written. ScaffoldError, before anything is written, when
    `directory` is a file or is not empty.
    """
    if directory.exists() and not directory.is_dir():
        raise ScaffoldError(f"{directory} exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()):
        raise ScaffoldError(f"{directory} is not empty; give a new or empty directory")
    if scheduler not in SCHEDULERS:
        raise ScaffoldError(f"--scheduler: must be none, slurm or eks, got {scheduler!r}")
    version, source = installed_version(), installed.direct_url()
    line = requirement_line(version, source)
    files = render(project_name(directory), version, requirement_note(version, source, line) + line,
                   hardened=hardened, scheduler=scheduler, ami_id=ami_id)
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
