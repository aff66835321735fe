"""What nodes download at boot is pinned and verified (components/gpucluster/node/install.sh).

Run for real under bash with curl, gpg, dpkg and apt-get replaced by stubs (tests/test_bootstrap.py's
Sandbox): the fake gpg reports the signer the test chooses, so a good signature by a pinned key,
a good signature by another key and a bad signature are each checked by behaviour.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpucluster.node.userdata import node_files, render_user_data, script
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
    for name, body in stubs.items():
        stub = box.bin / name
        stub.write_text(f'#!/bin/bash\necho "{name} $*" >> {box.log}\n{body}\n')
        stub.chmod(0o755)
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
