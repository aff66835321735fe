"""What nodes download at boot is pinned and verified (components/gpucluster/node/install.sh).

Run for real under bash with curl, gpg, dpkg and apt-get replaced by stubs (tests/test_bootstrap.py's
Sandbox): the fake gpg reports the signer the test chooses, so a good signature by a pinned key,
a good signature by another key and a bad signature are each checked by behaviour.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest

from fake_node import write_stubs
from gpucluster.node.userdata import node_env, node_files, render_user_data, script
from gpucluster.parts import DataMount
from test_bootstrap import Sandbox, lint, settings

CWA_KEY = "937616F3450B7D806CBD9725D58167303B789C72"
MOUNTPOINT_KEYS = ["8AEFE705EBE329C0948C75A66F1C3B3AEF4B030B", "673FE4061506BB469A0EF857BE397A52B086DA5A"]


def sandbox(tmp_path: Path, signer: str | None) -> Sandbox:
    """Stubs: curl writes a payload to `-o FILE`; gpg --verify prints VALIDSIG for `signer`
    (nothing: a bad signature); dpkg logs."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    fake_curl = tmp_path / "fake-curl"
    fake_curl.write_text('#!/bin/bash\nwhile [ $# -gt 0 ]; do\n'
                         '  [ "$1" = -o ] && { echo payload > "$2"; shift; }; shift\ndone\n')
    fake_curl.chmod(0o755)
    box = Sandbox(tmp_path, FAKE_CURL=str(fake_curl), FAKE_SIGNER=signer or "")
    stubs = {
        "gpg": 'case "$*" in *--verify*) [ -n "$FAKE_SIGNER" ] && '
               'echo "[GNUPG:] VALIDSIG SUBKEY 2025-01-01 0 4 0 1 10 00 $FAKE_SIGNER"; exit 0 ;; esac; true',
        "dpkg": "true",
    }
    write_stubs(box.bin, box.log, stubs)
    return box


def test_install_script_lints_clean(tmp_path: Path) -> None:
    path = tmp_path / "install.sh"
    path.write_text(script("install.sh"))
    lint(path)


def test_cloudwatch_agent_is_a_pinned_version_installed_after_its_signature_checks(tmp_path: Path) -> None:
    box = sandbox(tmp_path, CWA_KEY)
    result = box.run("install.sh", "cloudwatch-agent")
    assert result.returncode == 0, result.stderr + result.stdout
    base = "https://amazoncloudwatch-agent-us-east-1.s3.us-east-1.amazonaws.com"
    urls = [call.split()[-1] for call in box.calls("curl")]
    assert urls == [f"{base}/assets/amazon-cloudwatch-agent.gpg",
                    f"{base}/ubuntu/amd64/1.300072.0b1766/amazon-cloudwatch-agent.deb.sig",
                    f"{base}/ubuntu/amd64/1.300072.0b1766/amazon-cloudwatch-agent.deb"]
    [verify] = [c for c in box.calls("gpg") if "--verify" in c]
    [install] = box.calls("dpkg")
    assert install.startswith("-i -E ") and install.split()[-1] == verify.split()[-1]  # the file checked
    assert f"signed by {CWA_KEY}" in result.stdout


@pytest.mark.parametrize(("signer", "why"), [
    (MOUNTPOINT_KEYS[0], "a good signature by another project's key"),
    ("0123456789ABCDEF0123456789ABCDEF01234567", "a good signature by an unknown key"),
    (None, "a bad signature"),
])
def test_a_download_that_does_not_verify_is_never_installed(tmp_path: Path, signer: str | None,
                                                            why: str) -> None:
    box = sandbox(tmp_path, signer)
    result = box.run("install.sh", "cloudwatch-agent")
    assert result.returncode == 1, why
    assert box.calls("dpkg") == [], why
    assert "refusing https://amazoncloudwatch-agent-us-east-1" in result.stdout
    assert f"(signer: {signer or 'none'})" in result.stdout


@pytest.mark.parametrize("signer", MOUNTPOINT_KEYS)
def test_mountpoint_is_a_pinned_version_signed_by_a_pinned_key(tmp_path: Path, signer: str) -> None:
    box = sandbox(tmp_path, signer)
    result = box.run("install.sh", "mount-s3")
    assert result.returncode == 0, result.stderr + result.stdout
    base = "https://s3.amazonaws.com/mountpoint-s3-release"
    assert [c.split()[-1] for c in box.calls("curl")] == [
        f"{base}/public_keys/KEYS", f"{base}/1.18.0/x86_64/mount-s3-1.18.0-x86_64.deb.asc",
        f"{base}/1.18.0/x86_64/mount-s3-1.18.0-x86_64.deb"]
    [install] = box.calls("apt-get")
    assert re.fullmatch(r"-o DPkg::Lock::Timeout=600 install -y \S+/mount-s3-1\.18\.0-x86_64\.deb", install)
    refused = sandbox(tmp_path / "other", CWA_KEY).run("install.sh", "mount-s3")
    assert refused.returncode == 1


def test_the_lustre_client_comes_from_the_signed_repository_for_the_running_kernel(tmp_path: Path) -> None:
    text = script("install.sh")
    assert ('echo "deb [signed-by=$keyring] https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu '
            '$codename main"') in text
    assert 'package "${APT[@]}" install -y "lustre-client-modules-$(uname -r)"' in text


LUSTRE_KEY = "A" * 40
OTHER_KEY = "B" * 40


def lustre_sandbox(tmp_path: Path, keys: list[str], pinned: str) -> Sandbox:
    """install.sh lustre-client with the key file holding `keys` (each with a subkey) and `pinned`
    as the stack's fsx.client_key_fingerprints; keyring and apt sources land under tmp_path."""
    box = sandbox(tmp_path, None)
    records = "".join(f"pub:u:4096:1:{k[-16:]}:1:::::::scESC:\\nfpr:::::::::{k}:\\n"
                      f"sub:u:4096:1:{'C' * 16}:1::::::e:\\nfpr:::::::::{'C' * 40}:\\n" for k in keys)
    (box.bin / "gpg").write_text(
        f'#!/bin/bash\necho "gpg $*" >> {box.log}\n'
        f'case "$*" in *--show-keys*) printf "{records}" ;; esac\ntrue\n')
    for name in ("keyrings", "sources"):
        (tmp_path / name).mkdir()
    mount = DataMount(name="corpus", access="fsx", bucket_name="b", prefix="", path="/fsx",
                      fsx_dns_name="fs.example", fsx_mount_name="abc",
                      fsx_client_key_fingerprints=tuple(pinned.split()))
    box.node_env.write_text(node_env(replace(settings(), data_mounts=(mount,))))
    box.env |= {"GPUCLUSTER_KEYRING_DIR": str(tmp_path / "keyrings"),
                "GPUCLUSTER_APT_SOURCES_DIR": str(tmp_path / "sources")}
    return box


@pytest.mark.parametrize("pinned", [LUSTRE_KEY, f"{OTHER_KEY} {LUSTRE_KEY}"])
def test_the_lustre_client_installs_when_its_repository_key_is_pinned(tmp_path: Path, pinned: str) -> None:
    box = lustre_sandbox(tmp_path, [LUSTRE_KEY], pinned)
    result = box.run("install.sh", "lustre-client")
    assert result.returncode == 0, result.stderr + result.stdout
    [dearmor] = [c for c in box.calls("gpg") if "--dearmor" in c]
    assert f"-o {tmp_path}/keyrings/fsx-ubuntu-public-key.gpg" in dearmor
    assert (tmp_path / "sources/fsxlustreclientrepo.list").read_text().startswith(
        f"deb [signed-by={tmp_path}/keyrings/fsx-ubuntu-public-key.gpg] https://fsx-lustre-client-repo")
    assert box.calls("apt-get")[-1].endswith("install -y lustre-client-modules-" + os.uname().release)
    assert "not pinned" not in result.stdout


@pytest.mark.parametrize(("keys", "why"), [
    ([OTHER_KEY], "another key than the pinned one"),
    ([LUSTRE_KEY, OTHER_KEY], "the pinned key plus one more (apt would trust both)"),
    ([], "a key file without a key"),
])
def test_a_lustre_repository_key_that_is_not_pinned_is_refused(tmp_path: Path, keys: list[str],
                                                               why: str) -> None:
    box = lustre_sandbox(tmp_path, keys, LUSTRE_KEY)
    result = box.run("install.sh", "lustre-client")
    assert result.returncode == 1, why
    assert box.calls("apt-get") == [], why
    assert not [c for c in box.calls("gpg") if "--dearmor" in c], why
    assert not (tmp_path / "sources/fsxlustreclientrepo.list").exists(), why
    assert "refusing the Lustre client repository" in result.stdout


def test_without_a_pin_the_lustre_key_is_used_and_its_fingerprint_logged(tmp_path: Path) -> None:
    box = lustre_sandbox(tmp_path, [LUSTRE_KEY], "")
    result = box.run("install.sh", "lustre-client")
    assert result.returncode == 0, result.stderr + result.stdout
    assert f"key {LUSTRE_KEY} is not pinned (fsx.client_key_fingerprints)" in result.stdout
    assert "C" * 40 not in result.stdout  # subkeys are not what a pin names
    assert box.calls("apt-get")


def test_unknown_component_is_a_usage_error(tmp_path: Path) -> None:
    result = sandbox(tmp_path, CWA_KEY).run("install.sh", "kernel")
    assert result.returncode == 2 and "usage: gpucluster-install" in result.stderr


def test_nodes_ship_the_installer_and_never_download_latest() -> None:
    files = {f.path: f for f in node_files(settings())}
    assert files["/usr/local/sbin/gpucluster-install"].content == script("install.sh")
    assert files["/usr/local/sbin/gpucluster-install"].mode == "0755"
    user_data = render_user_data(settings())
    assert files["/usr/local/sbin/gpucluster-agent"].content == script("agent.sh") in user_data
    assert '"$INSTALL" cloudwatch-agent' in script("agent.sh")
    for name in ("bootstrap.sh", "data.sh", "install.sh"):
        assert "/latest/" not in script(name), name
    assert "curl" not in script("data.sh") and "curl" not in script("bootstrap.sh")
    assert '"$INSTALL" mount-s3' in script("data.sh") and '"$INSTALL" lustre-client' in script("data.sh")
