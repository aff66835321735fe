"""What EC2 Image Builder bakes into a node group's image: the component document, rendered per group.

It owns the build-once half of a node's boot, on the base image's own operating system as the node
scripts do (gpucluster-os: Ubuntu 22.04/24.04 with apt, Amazon Linux 2023 with dnf; any other stops the
bake before anything is installed): disable the AMI's first-boot package updates (Ubuntu's), install
the CloudWatch agent, the Lustre client for the AMI's kernel and Mountpoint for S3 (through the same
pinned, signature-checked `gpucluster-install` the unbaked path runs at boot), DCGM, check the EFA
software, pull the group's container image and, on a Slurm stack, install AWS's PCS agent and Slurm
(each verified with its GPG signature and the AWS PCS public key the catalog pins);
then validate that all of it is there, and, on an
instance launched from the new image, test the GPUs and record their count, the driver and the CUDA
version in the image's tags (what `gpucluster image build` and `plan` show). Pure: no Pulumi import
and no AWS call; `gpucluster.aws.images` hands the document to `aws.imagebuilder.Component`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import yaml

from gpucluster.catalog import PcsInstallerKey, pcs_installer_key
from gpucluster.node.userdata import OS_TOOL, script

# EC2 Image Builder user guide, "Use the component document framework": CreateComponent's `data`
# holds at most 16,000 characters (the document is refused beyond).
MAX_COMPONENT_CHARS = 16000
# The tags the image test writes on the new AMI; the build instance's role may write only these.
IMAGE_TAGS = ("gpucluster:gpus", "gpucluster:driver", "gpucluster:cuda")
CWA_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
FI_INFO = "/opt/amazon/efa/bin/fi_info"  # the EFA installer's (EC2 user guide, "Get started with EFA")
PACKAGE_UNITS = ("unattended-upgrades.service", "apt-daily.timer", "apt-daily-upgrade.timer",
                 "apt-daily.service", "apt-daily-upgrade.service")
INSTALL_TOOL = "/usr/local/sbin/gpucluster-install"


def recipe_name(cluster_name: str, identity: str, group: str) -> str:
    """Image Builder names are per account and region, not per stack: the identity's hash keeps two
    stacks with the same cluster name apart (names hold at most 126 characters)."""
    digest = hashlib.sha256(identity.encode()).hexdigest()[:8]
    return f"gpucluster-{cluster_name}-{group}-{digest}"


@dataclass(frozen=True)
class BakeSettings:
    """Everything one group's image needs (plain values)."""

    node_group: str
    region: str
    container_image: str | None
    fsx: bool
    """A dataset is mounted from FSx for Lustre: bake the Lustre client."""
    mount_s3: bool
    """A dataset is mounted with Mountpoint for S3: bake it."""
    efa: bool
    """The group uses EFA: the image must carry the EFA software."""
    build_gpus: int
    """GPUs the build/test instance type has: the test fails below that."""
    lustre_key_fingerprints: tuple[str, ...] = ()
    slurm_version: str | None = None
    """A Slurm stack's version (scheduler.slurm_version): bake AWS's PCS agent and Slurm installers."""


# "Software installers to build custom AMIs for AWS PCS",
# https://docs.aws.amazon.com/pcs/latest/userguide/working-with_ami_installers.html, its pages "Step 2 -
# Install the AWS PCS agent" and "Step 3 - Install Slurm": a custom AMI needs the AWS PCS agent and AWS's
# Slurm build, installed under /opt/aws/pcs/scheduler/slurm-<version> (ledger: pcs-installer-location,
# documented): the per-region bucket aws-pcs-repo-<region>.s3.<region>.amazonaws.com, the objects
# aws-pcs-agent/aws-pcs-agent-v1-latest.tar.gz and aws-pcs-slurm/aws-pcs-slurm-<version>-installer-latest
# .tar.gz, the directories they unpack to and `installer.sh` (`-y` for Slurm's). AWS publishes no
# `<name>.sha256` beside them: each is checked with its detached signature `<name>.sig` and the AWS PCS
# public key, whose fingerprint the catalog pins as the guide prints it (catalog/data/pcs_installers.yaml;
# ledger: pcs-installer-signing-key); an empty one stops the bake with one FAILED line. A wrong name
# fails the build (curl -f), never installs anything unchecked.
PCS_REPO = "https://aws-pcs-repo-{region}.s3.{region}.amazonaws.com"
PCS_SLURM_ROOT = "/opt/aws/pcs/scheduler/slurm-{version}"


def pcs_install_commands(region: str, slurm_version: str, key: PcsInstallerKey | None = None) -> str:
    """Download the PCS agent and Slurm installers, verify each one's signature with the AWS PCS public key
    whose fingerprint the catalog pins, install them without a prompt. `key`: the catalog's by default."""
    key = key or pcs_installer_key()
    repo, key_url = PCS_REPO.format(region=region), key.public_key_url.format(region=region)
    return (
        "set -euo pipefail\nexport DEBIAN_FRONTEND=noninteractive\n"
        "fail() { echo \"FAILED: $*\"; exit 1; }\n"
        f"repo='{repo}'\nfpr='{key.fingerprint or ''}'\n"
        "[[ $fpr =~ ^[0-9A-F]{40}$ ]] || fail \"no AWS PCS public key fingerprint is pinned in gpucluster's "
        "catalog (pcs_installers.yaml, from the AWS PCS user guide): nothing is installed unchecked\"\n"
        "work=$(mktemp -d)\ncd \"$work\"\n"
        "export GNUPGHOME=\"$work/gnupg\"\ninstall -d -m 0700 \"$GNUPGHOME\"\n"
        f"curl -fsSL --retry 5 -o aws-pcs-public-key.pub '{key_url}'\n"
        "gpg --batch --quiet --import aws-pcs-public-key.pub 2>/dev/null"
        " || fail \"no key in the AWS PCS public key file\"\n"
        "gpg --batch --with-colons --list-keys \"$fpr\" >/dev/null 2>&1"
        " || fail \"the AWS PCS public key downloaded is not the catalog's $fpr\"\n"
        "fetch() {  # $1: object name, $2: its folder; nothing unpacks before its signature verifies\n"
        "  curl -fsSL --retry 5 -o \"$1\" \"$repo/$2/$1\"\n"
        "  curl -fsSL --retry 5 -o \"$1.sig\" \"$repo/$2/$1.sig\"\n"
        "  local status\n"
        "  status=$(gpg --batch --status-fd 1 --verify \"$1.sig\" \"$1\" 2>/dev/null) || status=''\n"
        "  grep -q \"^\\[GNUPG:\\] VALIDSIG .* $fpr\\$\" <<<\"$status\""
        " || fail \"$1: its signature does not verify with the AWS PCS public key $fpr\"\n"
        "  tar -xzf \"$1\"\n}\n"
        "fetch aws-pcs-agent-v1-latest.tar.gz aws-pcs-agent\n"
        "(cd aws-pcs-agent && ./installer.sh </dev/null)\n"
        f"fetch aws-pcs-slurm-{slurm_version}-installer-latest.tar.gz aws-pcs-slurm\n"
        f"(cd aws-pcs-slurm-{slurm_version}-installer && ./installer.sh -y </dev/null)\n"
        "gpgconf --kill all 2>/dev/null || true\n"
        "cd / && rm -rf \"$work\"\n")


def _bash(name: str, commands: str) -> dict[str, Any]:
    return {"name": name, "action": "ExecuteBash", "inputs": {"commands": [commands]}}


def _tool_file(path: str, name: str) -> str:
    """Lines writing the node script `name` to `path` (a quoted here-document: written as shipped)."""
    return f"cat > {path} <<'GPUCLUSTER_FILE_EOF'\n" + script(name) + "GPUCLUSTER_FILE_EOF\n"


def build_steps(s: BakeSettings) -> list[dict[str, Any]]:
    """The build phase. Each step follows the base image's operating system as the node scripts do
    (gpucluster-os, from /etc/os-release: `ubuntu` installs with apt, `al2023` with dnf); any other
    stops the bake with gpucluster-os's one line once it is written, before anything is installed."""
    units = " ".join(PACKAGE_UNITS)
    steps = [
        # First: nothing else may race the installs for the dpkg lock, in the build or at any boot.
        # Amazon Linux 2023 installs no updates by itself and dnf waits for its own lock
        # (ledger: al2023-node-packages): nothing to stop there, as at an unbaked node's boot.
        # gpucluster-os is written in the next step (the component holds 16,000 characters: once);
        # this one reads the same os-release ID it reads.
        _bash("DisableUnattendedUpgrades",
              "set -euo pipefail\nos=$(. /etc/os-release && echo \"$ID\")\n"
              "if [ \"$os\" = ubuntu ]; then\n"
              f"systemctl stop {units} || true\nsystemctl disable {units} || true\nsystemctl mask {units}\n"
              "printf 'APT::Periodic::Update-Package-Lists \"0\";\\n"
              "APT::Periodic::Unattended-Upgrade \"0\";\\n' > /etc/apt/apt.conf.d/20auto-upgrades\n"
              "else\n  echo \"$os: no automatic package updates to stop\"\nfi\n"),
        _bash("InstallNodeTools",
              "set -euo pipefail\ninstall -d -m 0755 /etc/gpucluster /usr/local/sbin\n"
              # gpucluster-install asks gpucluster-os which package manager to use.
              + _tool_file(OS_TOOL, "os.sh") + _tool_file(INSTALL_TOOL, "install.sh")
              + f"chmod 0755 {OS_TOOL} {INSTALL_TOOL}\n"
              # An unsupported base stops here, with gpucluster-os's one line, before anything installs.
              + f"{OS_TOOL} >/dev/null\n"
              # Only what install.sh reads; the node's own node.env replaces it at boot.
              f"printf '%s\\n' GPUCLUSTER_REGION={s.region} "
              f"\"GPUCLUSTER_LUSTRE_KEY_FINGERPRINTS='{' '.join(s.lustre_key_fingerprints)}'\""
              " > /etc/gpucluster/node.env\n"
              f"[ -x {CWA_CTL} ] || {INSTALL_TOOL} cloudwatch-agent\n"
              + (f"modinfo lustre >/dev/null 2>&1 || {INSTALL_TOOL} lustre-client\n" if s.fsx else "")
              + (f"command -v mount-s3 >/dev/null || {INSTALL_TOOL} mount-s3\n" if s.mount_s3 else "")),
        # DCGM from NVIDIA's CUDA repository, which the Deep Learning AMIs configure (DCGM user guide,
        # "Getting Started": package datacenter-gpu-manager, apt on Ubuntu, dnf on Amazon Linux 2023;
        # that the Amazon Linux 2023 DLAMI configures the repository: ledger: al2023-bake-dcgm).
        _bash("InstallDcgm",
              f"set -euo pipefail\nexport DEBIAN_FRONTEND=noninteractive\nos=$({OS_TOOL})\n"
              "if ! command -v dcgmi >/dev/null; then\n"
              "  if [ \"$os\" = ubuntu ]; then\n"
              "    apt-get -o DPkg::Lock::Timeout=600 update\n"
              "    apt-get -o DPkg::Lock::Timeout=600 install -y datacenter-gpu-manager\n"
              "  else\n    dnf install -y datacenter-gpu-manager\n  fi\nfi\n"
              "systemctl enable nvidia-dcgm.service || true\n"),
    ]
    if s.efa:
        steps.append(_bash("CheckEfa", f"set -euo pipefail\n[ -x {FI_INFO} ] || {{ echo 'the base "
                           "image has no EFA software (fi_info)'; exit 1; }}\n"))
    if s.container_image:
        steps.append(_bash("PullContainerImage", pull_commands(s.container_image)))
    if s.slurm_version:
        steps.append(_bash("InstallAwsPcs", pcs_install_commands(s.region, s.slurm_version)))
    return steps


def pull_commands(image: str) -> str:
    """docker pull, logging in first to an ECR registry (ECR user guide, "Private registry
    authentication"): the build's role may pull from the stack's ECR repositories only."""
    registry = image.split("/", 1)[0] if "/" in image else ""
    # Docker from the OS's own packages where the base has none (the Deep Learning AMIs have it).
    lines = ["set -euo pipefail", f"command -v docker >/dev/null || {INSTALL_TOOL} container-runtime",
             "systemctl start docker"]
    if ".dkr.ecr." in registry:
        region = registry.split(".dkr.ecr.", 1)[1].split(".", 1)[0]
        lines.append(f"aws ecr get-login-password --region {region} | docker login --username AWS "
                     f"--password-stdin {registry}")
    lines.append(f"docker pull --quiet '{image}'")
    return "\n".join(lines) + "\n"


def validate_steps(s: BakeSettings) -> list[dict[str, Any]]:
    """What the launch path of a baked node (gpucluster-ready) checks, checked here first."""
    checks = [f"[ -x {CWA_CTL} ] || missing+=(cloudwatch-agent)",
              "command -v dcgmi >/dev/null || missing+=(dcgm)",
              # Ubuntu's only: Amazon Linux 2023 has no unattended upgrades to mask.
              f"[ \"$({OS_TOOL})\" != ubuntu ]"
              " || systemctl is-enabled unattended-upgrades.service 2>/dev/null"
              " | grep -q masked || missing+=(unattended-upgrades-masked)"]
    if s.fsx:
        checks.append("modinfo lustre >/dev/null 2>&1 || missing+=(lustre-client)")
    if s.mount_s3:
        checks.append("command -v mount-s3 >/dev/null || missing+=(mount-s3)")
    if s.efa:
        checks.append(f"[ -x {FI_INFO} ] || missing+=(efa)")
    if s.container_image:
        checks.append(f"docker image inspect '{s.container_image}' >/dev/null || missing+=(container-image)")
    if s.slurm_version:
        root = PCS_SLURM_ROOT.format(version=s.slurm_version)
        checks.append(f"[ -d {root} ] || missing+=(slurm-{s.slurm_version})")
    return [_bash("CheckBaked", "set -uo pipefail\nmissing=()\n" + "\n".join(checks) + "\n"
                  "if [ ${#missing[@]} -gt 0 ]; then echo \"missing: ${missing[*]}\"; exit 1; fi\n")]


def test_steps(s: BakeSettings) -> list[dict[str, Any]]:
    """On an instance launched from the new image: count the GPUs, read driver and CUDA, tag the AMI."""
    return [_bash("RecordGpuAndDriver", (
        "set -euo pipefail\n"
        "count=$(nvidia-smi --query-gpu=index --format=csv,noheader | grep -c '^[0-9]')\n"
        f"if [ \"$count\" -lt {s.build_gpus} ]; then echo \"$count of {s.build_gpus} GPUs\"; exit 1; fi\n"
        "driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)\n"
        # nvidia-smi's banner prints the highest CUDA version the driver supports.
        "cuda=$(nvidia-smi | sed -n 's/.*CUDA Version: *\\([0-9.]*\\).*/\\1/p' | head -n 1)\n"
        "token=$(curl -fsS -X PUT http://169.254.169.254/latest/api/token"
        " -H 'X-aws-ec2-metadata-token-ttl-seconds: 300')\n"
        "ami=$(curl -fsS -H \"X-aws-ec2-metadata-token: $token\""
        " http://169.254.169.254/latest/meta-data/ami-id)\n"
        f"aws ec2 create-tags --region {s.region} --resources \"$ami\" --tags"
        " \"Key=gpucluster:gpus,Value=$count\" \"Key=gpucluster:driver,Value=$driver\""
        " \"Key=gpucluster:cuda,Value=$cuda\"\n"
        "echo \"image $ami: $count GPUs, driver $driver, CUDA $cuda\"\n"))]


class _Literal(str):
    """A multi-line string dumped as a YAML literal block (readable in the console)."""


def _literal(dumper: yaml.SafeDumper, value: _Literal) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Literal, _literal)


def component_document(s: BakeSettings) -> str:
    """The AWSTOE document (schemaVersion 1.0: build, validate and test phases) for one group.

    EC2 Image Builder user guide, "Use the component document framework": phases `build`,
    `validate` (on the build instance) and `test` (on an instance launched from the new image).
    """
    def steps(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**st, "inputs": {"commands": [_Literal(c) for c in st["inputs"]["commands"]]}}
                for st in items]

    doc = {
        "name": f"gpucluster-{s.node_group}",
        "description": f"gpucluster node group {s.node_group}: installed once, checked at every launch",
        "schemaVersion": 1.0,
        "phases": [{"name": "build", "steps": steps(build_steps(s))},
                   {"name": "validate", "steps": steps(validate_steps(s))},
                   {"name": "test", "steps": steps(test_steps(s))}],
    }
    text = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000)
    if len(text) > MAX_COMPONENT_CHARS:
        raise ValueError(f"the Image Builder component of {s.node_group} is {len(text)} characters; "
                         f"Image Builder allows {MAX_COMPONENT_CHARS}")
    return text
