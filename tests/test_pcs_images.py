"""What AWS PCS needs of a Slurm stack's images and Capacity Blocks, checked offline: an image with the PCS
agent and Slurm for every group PCS launches (baked or pinned), the bake recipe that installs both, and a
Capacity Block group no larger than its block."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from base_config import base
from fake_node import logged_calls, write_stubs
from gpucluster.aws.children import images_args
from gpucluster.catalog import PcsInstallerKey, pcs_installer_key
from gpucluster.cli import app
from gpucluster.ledger import load_ledger
from gpucluster.node.bake import BakeSettings, component_document, pcs_install_commands
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError

AMI = "ami-0123456789abcdef0"
SHELLCHECK = str(Path(sys.executable).parent / "shellcheck")
BLOCK = {"market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0"}


def slurm_config(**scheduler: Any) -> dict[str, Any]:
    config = base()
    config["gpucluster:scheduler"] = {"type": "slurm", **scheduler}
    return config


def findings(config: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    return [(f.path, f.message) for f in err.value.findings]


# ------------------------------------------------------------------------ the AMI requirement


def test_a_slurm_stack_without_any_pcs_image_is_one_finding_naming_scheduler_ami_id() -> None:
    [(path, message)] = findings(slurm_config())
    assert path == "scheduler.ami_id"
    # both ways said, whole (not cut at the 200 characters of a finding)
    assert message == ("node groups gpu and login would boot without the PCS agent and Slurm 25.05: set an "
                       "AMI with both here, or bake (images.bake) or pin (ami_id) the node groups; login "
                       "needs it here")


def test_scheduler_ami_id_covers_every_group_and_the_login_group() -> None:
    spec = parse_stack_config(slurm_config(ami_id=AMI, slurm_version="24.11"), stack="t")
    assert spec.scheduler.ami_id == AMI


@pytest.mark.parametrize("cover", ["baked", "group ami"])
def test_a_baked_or_pinned_group_leaves_only_the_login_group(cover: str) -> None:
    config = slurm_config()
    if cover == "baked":
        config["gpucluster:images"] = {"bake": True}
        config["gpucluster:network"]["nat_gateway"] = True
    else:
        config["gpucluster:node_groups"][0]["ami_id"] = AMI
    [(path, message)] = findings(config)
    assert path == "scheduler.ami_id"
    assert message.startswith("the login group would boot without the PCS agent and Slurm 25.05: ")


def test_a_group_opted_out_of_baking_is_named() -> None:
    config = slurm_config()
    config["gpucluster:node_groups"].append({"name": "eval", "instance_types": ["g5.xlarge"], "max_nodes": 1,
                                             "capacity": {"spot_percent": 100}})
    config["gpucluster:network"]["nat_gateway"] = True
    config["gpucluster:images"] = {"bake": True, "groups": {"eval": {"bake": False}}}
    [(_, message)] = findings(config)
    assert message.startswith("node groups eval and login would boot")


def test_a_type_none_stack_needs_no_pcs_image() -> None:
    assert parse_stack_config(base(), stack="t").scheduler.ami_id is None


# ------------------------------------------------------------------------ the bake recipe


def phases(settings: BakeSettings) -> dict[str, dict[str, str]]:
    doc = yaml.safe_load(component_document(settings))
    return {p["name"]: {s["name"]: s["inputs"]["commands"][0] for s in p["steps"]} for p in doc["phases"]}


SETTINGS = dict(node_group="train", region="us-west-2", container_image=None, fsx=False, mount_s3=False,
                efa=True, build_gpus=1)


def test_a_slurm_recipe_installs_and_validates_the_pcs_agent_and_slurm() -> None:
    found = phases(BakeSettings(**SETTINGS, slurm_version="25.11"))
    assert list(found["build"])[-1] == "InstallAwsPcs"
    install = found["build"]["InstallAwsPcs"]
    assert "https://aws-pcs-repo-us-west-2.s3.us-west-2.amazonaws.com" in install
    assert "fetch aws-pcs-slurm-25.11-installer-latest.tar.gz aws-pcs-slurm" in install
    # AWS publishes a signature beside each installer, no `.sha256`: gpg checks it with the pinned key.
    assert 'gpg --batch --status-fd 1 --verify "$1.sig" "$1"' in install and ".sha256" not in install
    assert "aws-pcs-repo-public-keys-us-west-2" in install  # the catalog's key URL, in the stack's region
    check = found["validate"]["CheckBaked"]
    assert "[ -d /opt/aws/pcs/scheduler/slurm-25.11 ] || missing+=(slurm-25.11)" in check


def test_a_type_none_recipe_is_unchanged() -> None:
    plain = phases(BakeSettings(**SETTINGS))
    assert "InstallAwsPcs" not in plain["build"]
    assert "aws-pcs" not in component_document(BakeSettings(**SETTINGS))
    assert component_document(BakeSettings(**SETTINGS)) == component_document(
        BakeSettings(**SETTINGS, slurm_version=None))


def _baked(scheduler: dict[str, Any] | None) -> Any:
    config = base()
    config["gpucluster:network"]["nat_gateway"] = True
    config["gpucluster:images"] = {"bake": True}
    if scheduler is not None:
        config["gpucluster:scheduler"] = scheduler
    spec = parse_stack_config(config, stack="t")
    return images_args(spec, vpc_id="vpc-1", subnet_id="subnet-1", parent_images={"gpu": AMI})


def test_the_image_pipelines_get_the_slurm_version_only_on_a_slurm_stack() -> None:
    [group] = _baked({"type": "slurm", "ami_id": AMI, "slurm_version": "24.11"})["groups"]
    assert group["slurm_version"] == "24.11"
    [plain] = _baked(None)["groups"]
    assert "slurm_version" not in plain


def test_the_catalog_pins_the_pcs_key_the_guide_prints(tmp_path: Path) -> None:
    key = pcs_installer_key()
    assert "Software installers to build custom AMIs for AWS PCS" in key.source
    assert {e.id: e for e in load_ledger()}["pcs-installer-signing-key"].status == "documented"
    # The guide's `gpg --fingerprint 7EEF030EDDF5C21C` output, spaces removed: the key id is its tail.
    assert key.fingerprint == "1C24 32C1 862F 64D1 F90A  239A 7EEF 030E DDF5 C21C".replace(" ", "")
    assert key.fingerprint.endswith("7EEF030EDDF5C21C")
    for text, error in (("status: unverified\nsource: s\npublic_key_url: u\n", "missing fingerprint"),
                        ("status: unverified\nsource: s\npublic_key_url: u\nfingerprint: ABC\n",
                         "is not 40 hex digits")):
        path = tmp_path / f"{len(text)}.yaml"
        path.write_text(text)
        with pytest.raises(ValueError, match=error):
            pcs_installer_key(path)
    path = tmp_path / "spaced.yaml"
    path.write_text("status: documented\nsource: s\npublic_key_url: u\nfingerprint: '" + "ab12 " * 10 + "'\n")
    assert pcs_installer_key(path).fingerprint == "AB12" * 10


def test_the_install_commands_pass_shellcheck(tmp_path: Path) -> None:
    path = tmp_path / "install.sh"
    path.write_text(pcs_install_commands("us-east-1", "25.05"))
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    check = subprocess.run([SHELLCHECK, "-s", "bash", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout


def _installer(folder: str, log: Path) -> bytes:
    """A tarball holding `<folder>/installer.sh`, which logs that it ran and with which arguments."""
    body = f'#!/bin/bash\necho "{folder} $*" >> {log}\n'.encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo(f"{folder}/installer.sh")
        info.size, info.mode = len(body), 0o755
        tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A throwaway GPG signing key standing for AWS PCS's: its home and its fingerprint."""
    home = tmp_path_factory.mktemp("gnupg")
    home.chmod(0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}
    subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "pcs-test@example.invalid",
                    "ed25519", "sign", "never"], env=env, check=True, capture_output=True, timeout=60)
    listing = subprocess.run(["gpg", "--batch", "--with-colons", "--list-keys"], env=env, check=True,
                             capture_output=True, text=True).stdout
    fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
    return home, fingerprint


def _sign(signer: tuple[Path, str], data: bytes, out: Path) -> None:
    home, _ = signer
    subprocess.run(["gpg", "--batch", "--yes", "--detach-sign", "-o", str(out), "-"], input=data,
                   env={**os.environ, "GNUPGHOME": str(home)}, check=True, capture_output=True, timeout=60)


def _key(signer: tuple[Path, str], fingerprint: str | None = "signer") -> PcsInstallerKey:
    return PcsInstallerKey(fingerprint=signer[1] if fingerprint == "signer" else fingerprint,
                           public_key_url="https://keys-{region}.example/aws-pcs-public-key.pub",
                           source="test")


def _run(tmp_path: Path, signer: tuple[Path, str], corrupt: str | None = None,
         key: PcsInstallerKey | None = None) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The install commands under bash, with a curl that serves files from a local 'bucket'."""
    bucket, log = tmp_path / "bucket", tmp_path / "calls"
    bucket.mkdir(exist_ok=True)
    for name, folder in (("aws-pcs-agent-v1-latest.tar.gz", "aws-pcs-agent"),
                         ("aws-pcs-slurm-25.05-installer-latest.tar.gz", "aws-pcs-slurm-25.05-installer")):
        data = _installer(folder, log)
        (bucket / name).write_bytes(data)
        _sign(signer, b"tampered" if name == corrupt else data, bucket / f"{name}.sig")
    home, _ = signer
    (bucket / "aws-pcs-public-key.pub").write_bytes(subprocess.run(
        ["gpg", "--batch", "--export", signer[1]], env={**os.environ, "GNUPGHOME": str(home)},
        check=True, capture_output=True).stdout)
    # curl -fsSL --retry 5 -o FILE URL: copy the URL's last part from the bucket, fail as -f does if absent
    write_stubs(tmp_path / "bin", log, {"curl": f'src="{bucket}/${{6##*/}}"; [ -f "$src" ] || exit 22; '
                                                 'cp "$src" "$5"'})
    # The work dir (mktemp -d) in a short folder, as on a build instance: gpg's agent socket lives under
    # GNUPGHOME and a Unix socket path holds at most 107 bytes, which pytest-xdist's tmp paths can pass.
    work = Path(tempfile.mkdtemp(prefix="pcs-", dir="/tmp"))
    try:
        done = subprocess.run(["bash", "-c", pcs_install_commands("us-east-1", "25.05", key or _key(signer))],
                              capture_output=True, text=True,
                              env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "TMPDIR": str(work),
                                   "HOME": str(tmp_path)}, timeout=60)
        if done.returncode == 0:  # a finished install removes its work dir (a failed build ends the image)
            assert list(work.iterdir()) == []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return done, log


def test_the_installers_run_after_their_signatures_verify(tmp_path: Path, signer: tuple[Path, str]) -> None:
    done, log = _run(tmp_path, signer)
    assert done.returncode == 0, done.stdout + done.stderr
    repo = "https://aws-pcs-repo-us-east-1.s3.us-east-1.amazonaws.com"
    assert [c.split()[-1] for c in logged_calls(log, "curl")] == [
        "https://keys-us-east-1.example/aws-pcs-public-key.pub",
        f"{repo}/aws-pcs-agent/aws-pcs-agent-v1-latest.tar.gz",
        f"{repo}/aws-pcs-agent/aws-pcs-agent-v1-latest.tar.gz.sig",
        f"{repo}/aws-pcs-slurm/aws-pcs-slurm-25.05-installer-latest.tar.gz",
        f"{repo}/aws-pcs-slurm/aws-pcs-slurm-25.05-installer-latest.tar.gz.sig"]
    assert logged_calls(log, "aws-pcs-agent") == [""]
    assert logged_calls(log, "aws-pcs-slurm-25.05-installer") == ["-y"]


@pytest.mark.parametrize("corrupt", ["aws-pcs-agent-v1-latest.tar.gz",
                                     "aws-pcs-slurm-25.05-installer-latest.tar.gz"])
def test_a_bad_signature_fails_the_build_before_that_installer_runs(tmp_path: Path, signer: tuple[Path, str],
                                                                    corrupt: str) -> None:
    done, log = _run(tmp_path, signer, corrupt)
    assert done.returncode != 0
    assert done.stdout.splitlines()[-1] == (
        f"FAILED: {corrupt}: its signature does not verify with the AWS PCS public key {signer[1]}")
    assert logged_calls(log, "aws-pcs-slurm-25.05-installer") == []
    assert logged_calls(log, "aws-pcs-agent") == ([] if "agent" in corrupt else [""])


def test_a_key_that_is_not_the_pinned_one_fails_the_build(tmp_path: Path, signer: tuple[Path, str]) -> None:
    done, log = _run(tmp_path, signer, key=_key(signer, "0123456789ABCDEF0123456789ABCDEF01234567"))
    assert done.returncode != 0
    assert done.stdout.splitlines() == ["FAILED: the AWS PCS public key downloaded is not the catalog's "
                                        "0123456789ABCDEF0123456789ABCDEF01234567"]
    assert logged_calls(log, "aws-pcs-agent") == []


def test_no_pinned_fingerprint_fails_the_build_in_one_line_before_any_download(
        tmp_path: Path, signer: tuple[Path, str]) -> None:
    done, log = _run(tmp_path, signer, key=_key(signer, None))
    assert done.returncode != 0
    assert done.stdout.splitlines() == [
        "FAILED: no AWS PCS public key fingerprint is pinned in gpucluster's catalog (pcs_installers.yaml, "
        "from the AWS PCS user guide): nothing is installed unchecked"]
    assert logged_calls(log, "curl") == []


def test_a_missing_signature_fails_the_build(tmp_path: Path, signer: tuple[Path, str]) -> None:
    done, log = _run(tmp_path, signer)
    assert done.returncode == 0
    (tmp_path / "bucket" / "aws-pcs-agent-v1-latest.tar.gz.sig").unlink()
    log.unlink()
    done = subprocess.run(["bash", "-c", pcs_install_commands("us-east-1", "25.05", _key(signer))],
                          capture_output=True, text=True,
                          env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "TMPDIR": str(tmp_path),
                               "HOME": str(tmp_path)}, timeout=60)
    assert done.returncode != 0 and logged_calls(log, "aws-pcs-agent") == []


# ------------------------------------------------------------------------ Capacity Block size


def block_config(*, slurm: bool, max_nodes: int = 4, **capacity: Any) -> dict[str, Any]:
    config = slurm_config(ami_id=AMI) if slurm else base()
    config["gpucluster:network"]["availability_zones"] = ["us-east-1a"]
    config["gpucluster:node_groups"] = [{"name": "train", "instance_types": ["p5.48xlarge"], "min_nodes": 0,
                                         "desired_nodes": 0, "max_nodes": max_nodes,
                                         "capacity": {**BLOCK, **capacity}}]
    return config


@pytest.mark.parametrize("slurm", [True, False])
def test_a_block_group_larger_than_its_block_names_max_nodes(slurm: bool) -> None:
    assert findings(block_config(slurm=slurm, max_nodes=4, instance_count=2)) == [
        ("node_groups[0].max_nodes",
         "the Capacity Block holds 2 instances (capacity.instance_count): must be <= 2, got 4")]


@pytest.mark.parametrize("slurm", [True, False])
def test_a_block_group_within_its_block_passes(slurm: bool) -> None:
    spec = parse_stack_config(block_config(slurm=slurm, max_nodes=2, instance_count=2), stack="t")
    assert spec.node_groups[0].capacity.instance_count == 2


def test_a_slurm_block_group_needs_the_instance_count() -> None:
    assert findings(block_config(slurm=True)) == [
        ("node_groups[0].capacity.instance_count", "required for a Capacity Block on a Slurm stack: the "
                                                   "block's instance count, which caps the PCS compute node "
                                                   "group (max_nodes)")]


def test_a_type_none_block_group_may_leave_the_count_out() -> None:
    assert parse_stack_config(block_config(slurm=False), stack="t").node_groups[0].capacity.instance_count \
        is None


def test_the_instance_count_is_only_for_blocks() -> None:
    config = base()
    config["gpucluster:node_groups"][0]["capacity"]["instance_count"] = 2
    assert findings(config) == [("node_groups[0].capacity.instance_count", "only used with market: "
                                                                            "capacity_block")]


@pytest.mark.parametrize(("config", "key"), [
    (slurm_config(), "scheduler.ami_id"),
    (block_config(slurm=True, max_nodes=4, instance_count=2), "node_groups[0].max_nodes"),
    (block_config(slurm=True), "node_groups[0].capacity.instance_count"),
])
def test_plan_refuses_in_one_line_naming_the_key_and_exits_2(write_stack: Callable[..., Path],
                                                              config: dict[str, Any], key: str) -> None:
    result = CliRunner().invoke(app, ["plan", str(write_stack(config))])
    assert result.exit_code == 2
    assert len([line for line in result.output.splitlines() if line.lstrip().startswith(key)]) == 1, \
        result.output
    assert "Traceback" not in result.output
