"""Node scripts outside EC2 user data: the bundle, the loader under bash, and the stack's bucket.

The loader (fetch-scripts.sh, written and run by the user data) runs here for real, inside the whole
rendered user data, with `aws`, `systemctl` and `sleep` replaced by stubs on PATH that log their
calls and every absolute path moved under the test's own root. The Pulumi side (the node-scripts
bucket, its protections, the bundle object and the node role's one new statement) under the mock engine.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from base_config import base, plan_config
from fake_node import logged_calls, os_env, write_stubs
from gpucluster.node import bundle
from gpucluster.node.bundle import bundle_bytes, bundle_key, bundle_sha256, pack, scripts_source
from gpucluster.node.userdata import (
    BUNDLE_SCRIPTS,
    SCRIPTS_DIR,
    UNGATED_HEALTH_CHECK,
    bundle_members,
    node_files,
    render_user_data,
)
from gpucluster.plan import MOCK_ACCOUNT, Plan
from shipped import shipped_plan
from test_bootstrap import lint, settings

BUCKET = "c-node-scripts-20260101000000000000000001"
OWNER = "123456789012"
SOURCE = scripts_source(BUCKET, OWNER)
NODE = Path(bundle.__file__).parent


# ------------------------------------------------------------------------------ the bundle


def members_of(data: bytes) -> dict[str, str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers()}  # type: ignore[union-attr]


def test_the_bundle_holds_every_shipped_script_as_nodes_run_it() -> None:
    members = members_of(bundle_bytes())
    assert sorted(members) == sorted((*BUNDLE_SCRIPTS, UNGATED_HEALTH_CHECK))
    assert members == bundle_members()
    assert "# >>> ready gate" not in members[UNGATED_HEALTH_CHECK]
    assert members["health-check.sh"] != members[UNGATED_HEALTH_CHECK]
    # every *.sh next to the renderer is in it, but the user data's own template and its loader
    assert {p.name for p in NODE.glob("*.sh")} - set(members) == {"bootstrap.sh", "fetch-scripts.sh",
                                                                  "nccl-test.sh"}


def test_every_shipped_file_a_group_writes_comes_from_the_bundle_with_the_same_text() -> None:
    for changes in ({}, {"mig_layouts": (("*", "3g.20gb:0"),)}, {"baked": True}):
        b = settings(**changes)
        shipped = [f for f in node_files(b) if f.member is not None]
        assert shipped and all(bundle_members()[f.member] == f.content for f in shipped)


def test_the_bundle_is_reproducible_and_its_key_carries_its_digest() -> None:
    assert pack(bundle_members()) == bundle_bytes()
    digest = hashlib.sha256(bundle_bytes()).hexdigest()
    assert bundle_sha256() == digest and bundle_key() == f"node-scripts/{digest}.tar"
    changed = {**bundle_members(), "mig.sh": bundle_members()["mig.sh"] + "echo changed\n"}
    assert hashlib.sha256(pack(changed)).hexdigest() != digest
    with tarfile.open(fileobj=io.BytesIO(bundle_bytes())) as tar:
        assert {(m.mode, m.uid, m.gid, m.mtime, m.isfile()) for m in tar.getmembers()} == {
            (0o644, 0, 0, 0, True)}


# ------------------------------------------------------------------- the loader, under bash


class Node:
    """The user data of a plain group, with its scripts in the bundle, run under a root of its own."""

    def __init__(self, tmp: Path, bundle_data: bytes = b"", failures: int = 0, **env: str) -> None:
        self.root, self.log = tmp / "root", tmp / "calls.log"
        served = tmp / "served.tar"
        served.write_bytes(bundle_data or bundle_bytes())
        count = tmp / "aws-count"
        write_stubs(tmp / "bin", self.log, {
            # s3api get-object ... OUTFILE: the served bundle, after `failures` throttled attempts
            "aws": f'n=$(( $(cat {count} 2>/dev/null || echo 0) + 1 )); echo "$n" > {count}\n'
                   f'if [ "$n" -le {failures} ]; then echo "An error occurred (SlowDown) when calling '
                   'the GetObject operation (reached max retries: 2)" >&2; exit 254; fi\n'
                   f'cp {served} "${{@: -1}}"; echo "{{}}"',
            "systemctl": "true", "sleep": "true", "logger": "true"})
        self.env = {"PATH": f"{tmp / 'bin'}:{os.environ['PATH']}",
                    "GPUCLUSTER_OS_RELEASE": os_env(tmp / "os")["GPUCLUSTER_OS_RELEASE"], **env}
        b = settings(efa=False, gpudirect_rdma=False, watch_spot=False, interruption_command=None,
                     data_mounts=())
        self.files = node_files(b)
        text = render_user_data(b, SOURCE)
        # every absolute path of the node under the root (the bundle's own text is not touched)
        self.script = tmp / "user-data.sh"
        self.script.write_text(re.sub(r"(?<=[\s'(])/(usr|etc|opt|var|run)/", rf"{self.root}/\1/", text))
        for d in ("var/log", "etc/gpucluster", "usr/local/sbin", "etc/systemd/system", "etc/profile.d",
                  "opt/aws/amazon-cloudwatch-agent/etc"):
            (self.root / d).mkdir(parents=True, exist_ok=True)

    def boot(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(self.script)], env=self.env, capture_output=True, text=True,
                              timeout=60)

    def calls(self, command: str) -> list[str]:
        return logged_calls(self.log, command)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")


def test_a_bundle_with_the_expected_digest_is_unpacked_and_the_bootstrap_runs(tmp_path: Path) -> None:
    node = Node(tmp_path)
    result = node.boot()
    assert result.returncode == 0, result.stdout + result.stderr
    [fetch] = node.calls("aws")
    target = f"{node.root}/usr/local/lib/gpucluster/scripts"
    assert fetch.startswith("s3api get-object --cli-connect-timeout 10 --cli-read-timeout 60 "
                            f"--region us-east-1 --bucket {BUCKET} --key {bundle_key()} "
                            f"--expected-bucket-owner {OWNER} ")
    assert f"gpucluster bootstrap: node scripts {bundle_sha256()} verified" in result.stdout
    for f in node.files:  # every file in place, the shipped scripts from the bundle, byte for byte
        written = node.path(f.path)
        assert written.read_text() == f.content if f.member else written.exists(), f.path
        assert oct(written.stat().st_mode & 0o777) == oct(int(f.mode, 8)), f.path
    assert sorted(p.name for p in Path(target).iterdir()) == sorted(bundle_members())
    # ... and then the bootstrap itself: its units enabled and started, to its last line
    assert "enable gpucluster-agent.service" in node.calls("systemctl")
    assert "gpucluster bootstrap: done" in result.stdout


def test_a_bundle_with_another_digest_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    tampered = bytearray(bundle_bytes())
    tampered[600] ^= 1  # one bit of the first script
    node = Node(tmp_path, bytes(tampered))
    result = node.boot()
    assert result.returncode == 1
    got = hashlib.sha256(bytes(tampered)).hexdigest()
    assert (f"gpucluster bootstrap: FAILED: node scripts s3://{BUCKET}/{bundle_key()} have sha256 {got}, "
            f"the stack expects {bundle_sha256()}: refusing to run them") in result.stdout
    assert not node.path(SCRIPTS_DIR).exists()
    assert not node.path("/usr/local/sbin/gpucluster-scratch").exists()
    assert not node.path("/etc/gpucluster/node.env").exists()
    assert node.calls("systemctl") == []  # no unit enabled, the launch check never answers
    assert "gpucluster bootstrap: done" not in result.stdout


def test_a_fetch_that_fails_is_retried_with_a_doubling_wait_until_it_lands(tmp_path: Path) -> None:
    node = Node(tmp_path, failures=7)
    result = node.boot()
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(node.calls("aws")) == 8
    assert node.calls("sleep") == ["2", "4", "8", "16", "32", "60", "60"]  # capped at a minute
    assert (f"node scripts s3://{BUCKET}/{bundle_key()}: attempt 1 failed (An error occurred (SlowDown) "
            "when calling the GetObject operation (reached max retries: 2)); again in 2s") in result.stdout
    assert node.path("/usr/local/sbin/gpucluster-report").read_text() == bundle_members()["report.sh"]


def test_a_fetch_that_never_lands_fails_the_boot_in_one_line(tmp_path: Path) -> None:
    node = Node(tmp_path, failures=100, GPUCLUSTER_FETCH_ATTEMPTS="3")
    result = node.boot()
    assert result.returncode == 1
    assert len(node.calls("aws")) == 3
    failed = [line for line in result.stdout.splitlines() if "FAILED" in line]
    assert failed == [f"gpucluster bootstrap: FAILED: node scripts s3://{BUCKET}/{bundle_key()} not fetched "
                      "after 3 attempts (last: An error occurred (SlowDown) when calling the GetObject "
                      "operation (reached max retries: 2)): the node does not start"]
    assert node.calls("systemctl") == [] and not node.path(SCRIPTS_DIR).exists()


def test_a_bundle_that_cannot_be_unpacked_fails_the_boot_in_one_line(tmp_path: Path) -> None:
    node = Node(tmp_path)
    blocker = node.path(SCRIPTS_DIR)
    blocker.parent.mkdir(parents=True)
    blocker.write_text("a file where the directory goes")
    result = node.boot()
    assert result.returncode == 1
    assert (f"gpucluster bootstrap: FAILED: node scripts {bundle_sha256()} verified but not unpacked into "
            f"{blocker}") in result.stdout
    assert node.calls("systemctl") == []


def test_the_loader_refuses_to_guess_its_arguments(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(NODE / "fetch-scripts.sh"), "us-east-1", BUCKET],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "usage: gpucluster-fetch-scripts" in result.stderr


def test_the_loader_and_the_user_data_with_it_lint_clean(tmp_path: Path) -> None:
    lint(NODE / "fetch-scripts.sh")
    path = tmp_path / "user-data.sh"
    path.write_text(render_user_data(settings(mig_layouts=(("*", "3g.20gb:0"),)), SOURCE))
    lint(path)


def test_a_groups_own_files_cannot_land_where_the_bundle_is_unpacked() -> None:
    from gpucluster.spec.node_groups import RESERVED_NODE_PATHS
    assert SCRIPTS_DIR.startswith(RESERVED_NODE_PATHS)


def test_without_a_source_every_script_stays_in_the_user_data() -> None:
    """GpuNodeGroup given no node_scripts: today's user data, byte for byte, no loader."""
    b = settings()
    text = render_user_data(b)
    assert "gpucluster-fetch-scripts" not in text and SCRIPTS_DIR not in text
    assert all(f.content in text for f in node_files(b) if f.member)


# ------------------------------------------------------------------------- the stack's side


@pytest.fixture(scope="module")
def prod() -> Plan:
    return shipped_plan("prod")


def one(plan: Plan, type_: str, name_part: str = "-node-scripts-") -> Any:
    [found] = [r for r in plan.of_type(type_) if name_part in r.name]
    return found


def test_the_scripts_bucket_is_private_encrypted_versioned_tls_only_and_protected(prod: Plan) -> None:
    bucket = one(prod, "aws:s3/bucket:Bucket")
    assert bucket.name == "gpu-prod-node-scripts-bucket" and bucket.protect and bucket.retain_on_delete
    assert bucket.inputs["bucketPrefix"] == "gpu-prod-node-scripts-"
    assert bucket.inputs["forceDestroy"] is False
    assert bucket.inputs["tags"]["gpucluster:stack"] == prod.spec.identity
    assert bucket.inputs["tags"]["gpucluster:purpose"] == "node-scripts"
    parts = {t: one(prod, t) for t in (
        "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", "aws:s3/bucketVersioning:BucketVersioning",
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws:s3/bucketOwnershipControls:BucketOwnershipControls", "aws:s3/bucketPolicy:BucketPolicy")}
    assert all(p.protect and p.retain_on_delete for p in parts.values())
    block = parts["aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"].inputs
    assert all(block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls",
                                          "restrictPublicBuckets"))
    assert parts["aws:s3/bucketVersioning:BucketVersioning"].inputs["versioningConfiguration"] == {
        "status": "Enabled"}
    [rule] = parts["aws:s3/bucketServerSideEncryptionConfiguration:"
                   "BucketServerSideEncryptionConfiguration"].inputs["rules"]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "AES256"
    policy = json.loads(parts["aws:s3/bucketPolicy:BucketPolicy"].inputs["policy"])
    tls, deletion = policy["Statement"]
    assert tls["Sid"] == "DenyInsecureTransport"
    assert tls["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deletion["Sid"] == "DataDeletionNeedsBreakGlass"
    assert deletion["Action"] == ["s3:DeleteObjectVersion", "s3:DeleteBucket"]
    assert deletion["Condition"] == {"ArnNotEquals": {"aws:PrincipalArn": f"arn:aws:iam::{MOCK_ACCOUNT}:role/"
                                                                         f"{prod.spec.cluster.break_glass_role}"}}


def test_the_bundle_object_is_the_one_every_launch_template_names(prod: Plan) -> None:
    [obj] = prod.of_type("aws:s3/bucketObjectv2:BucketObjectv2")
    assert obj.inputs["key"] == bundle_key() and obj.retain_on_delete and not obj.protect
    data = base64.b64decode(obj.inputs["contentBase64"])
    assert hashlib.sha256(data).hexdigest() == bundle_sha256() and data == bundle_bytes()
    assert obj.inputs["checksumAlgorithm"] == "SHA256" and obj.inputs["serverSideEncryption"] == "AES256"
    assert obj.inputs["tags"]["gpucluster:stack"] == prod.spec.identity
    templates = prod.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    assert len(templates) == len(prod.spec.node_groups)
    for template in templates:
        text = gzip.decompress(base64.b64decode(template.inputs["userData"])).decode()
        [fetch] = [line for line in text.splitlines() if line.startswith("/usr/local/sbin/gpucluster-fetch")]
        assert fetch.split()[1:] == ["us-east-1", prod.outputs["node_scripts"]["bucket_name"], bundle_key(),
                                     MOCK_ACCOUNT, bundle_sha256(), SCRIPTS_DIR]
        assert "cat > /usr/local/sbin/gpucluster-health-check" not in text  # from the bundle


def test_each_node_role_gets_exactly_getobject_on_the_bundle_prefix(prod: Plan) -> None:
    bucket = prod.outputs["node_scripts"]["bucket_name"]
    assert bucket.startswith("gpu-prod-node-scripts-")
    policies = [p for p in prod.of_type("aws:iam/rolePolicy:RolePolicy") if p.name.endswith("-scripts")]
    assert len(policies) == len(prod.spec.node_groups)
    for policy in policies:
        assert json.loads(policy.inputs["policy"])["Statement"] == [{
            "Sid": "ReadNodeScriptsOnly", "Effect": "Allow", "Action": ["s3:GetObject"],
            "Resource": [f"arn:aws:s3:::{bucket}/node-scripts/*"],
            "Condition": {"StringEquals": {"s3:ResourceAccount": MOCK_ACCOUNT}}}]
    # no other statement of any node role names the bucket
    others = [p for p in prod.of_type("aws:iam/rolePolicy:RolePolicy") if not p.name.endswith("-scripts")]
    assert not any(bucket in p.inputs["policy"] for p in others)


def test_a_changed_script_changes_the_digest_the_object_and_every_launch_template(
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = base()
    before = plan_config(config)
    original = bundle_members()
    monkeypatch.setattr(bundle, "bundle_members",
                        lambda: {**original, "report.sh": original["report.sh"] + "true\n"})
    bundle.bundle_bytes.cache_clear()
    bundle.bundle_sha256.cache_clear()
    try:
        changed = bundle_sha256()
        after = plan_config(base())
    finally:
        monkeypatch.undo()
        bundle.bundle_bytes.cache_clear()
        bundle.bundle_sha256.cache_clear()
    assert changed != bundle_sha256()
    [obj] = after.of_type("aws:s3/bucketObjectv2:BucketObjectv2")
    assert obj.inputs["key"] == f"node-scripts/{changed}.tar"
    [old], [new] = (p.of_type("aws:ec2/launchTemplate:LaunchTemplate") for p in (before, after))
    assert old.inputs["userData"] != new.inputs["userData"]
    assert changed in gzip.decompress(base64.b64decode(new.inputs["userData"])).decode()


def test_components_on_their_own_take_the_bucket_or_keep_the_scripts_inline() -> None:
    """GpuNodeGroup and NodeIdentity outside GpuCluster: with a NodeScripts' `source` the group's user
    data fetches the bundle and the role reads that prefix; without, everything is in the user data."""
    from gpucluster import GpuNodeGroup, NodeIdentity, NodeScripts
    from gpucluster.plan import record_resources

    def build() -> None:
        scripts = NodeScripts("research-scripts", {"cluster_name": "research",
                                                   "identity": "o/p/s/research", "region": "us-east-1"})
        for name, source in (("fetched", scripts.source), ("inline", None)):
            extra = {"node_scripts": source} if source is not None else {}
            identity = NodeIdentity(f"{name}-nodes",
                                    {"cluster_name": "research", **extra})  # type: ignore[typeddict-item]
            GpuNodeGroup(name, {  # type: ignore[typeddict-item]
                "cluster_name": "research", "region": "us-east-1", "identity": "o/p/s/research",
                "subnet_ids": ["subnet-0123456789abcdef0"],
                "security_group_ids": ["sg-0123456789abcdef0"],
                "instance_profile_arn": identity.instance_profile_arn,
                "node_role_name": identity.role_name,
                "node_group": {"name": name, "instance_types": ["g6.xlarge"], "max_nodes": 1,
                               "availability_zones": ["us-east-1a"]}, **extra})

    resources, _ = record_resources(build)
    texts = {r.name: gzip.decompress(base64.b64decode(r.inputs["userData"])).decode()
             for r in resources if r.type == "aws:ec2/launchTemplate:LaunchTemplate"}
    assert f" {bundle_key()} {MOCK_ACCOUNT} {bundle_sha256()} " in texts["fetched-lt"]
    assert "gpucluster-fetch-scripts" not in texts["inline-lt"]
    assert bundle_members()[UNGATED_HEALTH_CHECK] in texts["inline-lt"]
    scripts = [r for r in resources
               if r.type == "aws:iam/rolePolicy:RolePolicy" and r.name.endswith("-scripts")]
    assert [r.name for r in scripts] == ["fetched-nodes-scripts"]
    [objects] = [[r for r in resources if r.type == "aws:s3/bucketObjectv2:BucketObjectv2"]]
    assert [o.inputs["key"] for o in objects] == [bundle_key()]


def test_no_node_launches_before_the_bundle_is_uploaded_and_the_bucket_set_up(prod: Plan) -> None:
    """The user data is rendered from the bucket's name, which resolves only once the bundle object
    and every protection exist: the engine creates them before any launch template names them."""
    [obj] = prod.of_type("aws:s3/bucketObjectv2:BucketObjectv2")
    protections = [one(prod, t).urn for t in ("aws:s3/bucketPolicy:BucketPolicy",
                                              "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
                                              "aws:s3/bucketVersioning:BucketVersioning")]
    for template in prod.of_type("aws:ec2/launchTemplate:LaunchTemplate"):
        user_data = set(template.property_dependencies.get("userData", ()))
        assert obj.urn in user_data and set(protections) <= user_data, template.name
    for policy in (p for p in prod.of_type("aws:iam/rolePolicy:RolePolicy") if p.name.endswith("-scripts")):
        assert obj.urn in policy.property_dependencies.get("policy", ()), policy.name
