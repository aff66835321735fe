"""Datasets under the mock engine: what a bucket, an FSx file system and the node grants look like."""

from __future__ import annotations

import base64
import copy
import gzip
import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pytest

from base_config import BASE_CONFIG  # tests/ is on sys.path (pytest rootdir conftest import)
from gpucluster.aws.cluster import build_datasets
from gpucluster.aws.datasets import (
    bucket_arn,
    partition_of,
    s3_url,
    tls_only_policy,
)
from gpucluster.plan import PlannedResource, load_stack, record_resources, run_program
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError, StackSpec, stack_warnings
from shipped import shipped_plan

BUCKET = "aws:s3/bucket:Bucket"
S3_CONFIG = {
    "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
    "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
    "aws:s3/bucketVersioning:BucketVersioning",
    "aws:s3/bucketPolicy:BucketPolicy",
    "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
}
FS = "aws:fsx/lustreFileSystem:LustreFileSystem"
DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SUBNET_A, SUBNET_B, SUBNET_D = ("subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb",
                                "subnet-0dddddddddddddddd")
SUBNETS = {"us-east-1a": SUBNET_A, "us-east-1b": SUBNET_B}
NODE_SG = "sg-0123456789abcdef0"
VPC = "vpc-0123456789abcdef0"


@dataclass
class Run:
    resources: list[PlannedResource]
    exported: dict[str, Any]

    def of(self, type_token: str) -> list[PlannedResource]:
        return [r for r in self.resources if r.type == type_token]

    def one(self, type_token: str, name: str | None = None) -> PlannedResource:
        found = [r for r in self.of(type_token) if name is None or r.name == name]
        assert len(found) == 1, [r.name for r in found]
        return found[0]


def run_store(spec: StackSpec, subnets: dict[str, str] | None = None) -> Run:
    """Build a stack's datasets (as GpuCluster does) under recording mocks; export what they hand on."""

    def build() -> None:
        store = build_datasets("ds", spec, vpc_id=VPC, subnet_ids_by_zone=subnets or SUBNETS,
                               node_security_group_ids={"gpu": NODE_SG})
        pulumi.export("grants", [{"bucket": g.bucket_name, "prefix": g.prefix, "write": g.write}
                                 for g in store.grants])
        pulumi.export("mounts", [{"name": m["name"], "access": m["access"], "bucket": m["bucket_name"],
                                  "prefix": m["prefix"], "path": m["path"], "dns": m.get("fsx_dns_name"),
                                  "mount_name": m.get("fsx_mount_name")} for m in store.mounts])
        pulumi.export("datasets", store.outputs)

    resources, exported = record_resources(build, stack=spec.stack, region=spec.region)
    return Run(resources, exported)


def spec_with(base_config: dict[str, Any], *datasets: dict[str, Any], **group: Any) -> StackSpec:
    base_config["gpucluster:datasets"] = list(datasets)
    base_config["gpucluster:node_groups"][0].update(group)
    return parse_stack_config(base_config, stack="test")


# --------------------------------------------------------------------- created buckets


@pytest.fixture(scope="module")
def created() -> Run:
    return run_store(spec_with(copy.deepcopy(BASE_CONFIG), {
        "name": "corpus", "bucket_name": "acme-corpus", "prefix": "data/", "checkpoint_prefix": "ckpt/",
        "noncurrent_version_expiration_days": 21}))


def test_created_bucket_is_named_encrypted_and_versioned(created: Run) -> None:
    bucket = created.one(BUCKET)
    assert bucket.inputs["bucket"] == "acme-corpus" and "bucketPrefix" not in bucket.inputs
    assert bucket.inputs["forceDestroy"] is False
    assert bucket.inputs["tags"]["gpucluster:dataset"] == "corpus"
    assert bucket.inputs["tags"]["gpucluster:stack"] == "organization/gpucluster/test/test"
    sse = created.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration")
    assert sse.inputs["bucket"] == "acme-corpus"
    assert sse.inputs["rules"] == [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": "AES256"}}]
    versioning = created.one("aws:s3/bucketVersioning:BucketVersioning")
    assert versioning.inputs["versioningConfiguration"] == {"status": "Enabled"}


def test_created_bucket_blocks_public_access_and_acls(created: Run) -> None:
    block = created.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    flags = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    assert {flag: block.inputs.get(flag) for flag in flags} == dict.fromkeys(flags, True)
    ownership = created.one("aws:s3/bucketOwnershipControls:BucketOwnershipControls")
    assert ownership.inputs["rule"] == {"objectOwnership": "BucketOwnerEnforced"}


def test_created_bucket_policy_denies_requests_without_tls(created: Run) -> None:
    policy = json.loads(created.one("aws:s3/bucketPolicy:BucketPolicy").inputs["policy"])
    assert policy["Statement"][:1] == [{  # deletion: tests/test_data_protection.py
        "Sid": "DenyInsecureTransport", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
        "Resource": ["arn:aws:s3:::acme-corpus", "arn:aws:s3:::acme-corpus/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }]


def test_lifecycle_expires_only_old_checkpoint_versions(created: Run) -> None:
    rules = created.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs["rules"]
    by_id = {rule["id"]: rule for rule in rules}
    assert by_id["expire-noncurrent-checkpoint-versions"] == {
        "id": "expire-noncurrent-checkpoint-versions", "status": "Enabled", "filter": {"prefix": "ckpt/"},
        "noncurrentVersionExpiration": {"noncurrentDays": 21, "newerNoncurrentVersions": 3}}
    assert by_id["abort-incomplete-multipart-uploads"]["abortIncompleteMultipartUpload"] == {
        "daysAfterInitiation": 7}
    assert len(rules) == 2
    assert not any("expiration" in rule or "transitions" in rule for rule in rules), \
        "current objects must never be expired"


def test_created_bucket_and_its_configuration_are_protected_and_retained(created: Run) -> None:
    s3 = [r for r in created.resources if r.type == BUCKET or r.type in S3_CONFIG]
    assert {r.type for r in s3} == S3_CONFIG | {BUCKET}
    assert all(r.protect and r.retain_on_delete for r in s3), [r.name for r in s3 if not r.protect]


def test_lifecycle_keeps_the_newest_checkpoint_versions(base_config: dict[str, Any]) -> None:
    run = run_store(spec_with(base_config, {
        "name": "corpus", "checkpoint_prefix": "ckpt/", "noncurrent_version_expiration_days": 1,
        "newer_noncurrent_versions": 10}))
    rules = run.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs["rules"]
    expire = next(r for r in rules if r["id"] == "expire-noncurrent-checkpoint-versions")
    assert expire["noncurrentVersionExpiration"] == {"noncurrentDays": 1, "newerNoncurrentVersions": 10}


@pytest.mark.parametrize(("dataset", "message"), [
    ({"name": "ckpts", "newer_noncurrent_versions": 0, "checkpoint_prefix": "c/"}, "must be 1..100, got 0"),
    ({"name": "ckpts", "newer_noncurrent_versions": 5}, "only used with a checkpoint_prefix"),
    ({"name": "ckpts", "bucket_name": "acme-c", "existing": True, "checkpoint_prefix": "c/",
      "newer_noncurrent_versions": 5}, "only applies to buckets this stack creates"),
])
def test_newer_noncurrent_versions_is_checked(base_config: dict[str, Any], dataset: dict[str, Any],
                                              message: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_with(base_config, dataset)
    assert [(f.path, message in f.message) for f in err.value.findings] == [
        ("datasets[0].newer_noncurrent_versions", True)]


def test_created_bucket_grants_read_data_and_write_checkpoints_only(created: Run) -> None:
    assert created.exported["grants"] == [
        {"bucket": "acme-corpus", "prefix": "data/", "write": False},
        {"bucket": "acme-corpus", "prefix": "ckpt/", "write": True},
    ]
    assert created.exported["mounts"] == [{"name": "corpus", "access": "mount", "bucket": "acme-corpus",
                                           "prefix": "data/", "path": "/data/corpus", "dns": None,
                                           "mount_name": None}]
    out = created.exported["datasets"]["corpus"]
    assert (out["bucket_name"], out["bucket_arn"]) == ("acme-corpus", "arn:aws:s3:::acme-corpus")


def test_unnamed_bucket_gets_a_cluster_and_dataset_prefix(base_config: dict[str, Any]) -> None:
    run = run_store(spec_with(base_config, {"name": "scratchpad", "access": "copy_to_scratch"}))
    bucket = run.one(BUCKET)
    assert bucket.inputs["bucketPrefix"] == "test-scratchpad-" and "bucket" not in bucket.inputs
    name = run.exported["datasets"]["scratchpad"]["bucket_name"]
    assert name.startswith("test-scratchpad-") and len(name) <= 63
    rules = run.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration").inputs["rules"]
    assert [r["id"] for r in rules] == ["abort-incomplete-multipart-uploads"]  # no checkpoint prefix
    assert run.exported["grants"] == [{"bucket": name, "prefix": "", "write": False}]
    assert run.exported["mounts"][0]["path"] == "/scratch/scratchpad"


# -------------------------------------------------------------------- existing buckets


def test_existing_bucket_is_never_created_or_changed_and_read_only(base_config: dict[str, Any]) -> None:
    run = run_store(spec_with(base_config, {"name": "eval", "bucket_name": "acme-eval", "existing": True,
                                            "prefix": "eval/", "access": "copy_to_scratch"}))
    assert not [r for r in run.resources if r.custom], "an existing bucket creates no resource"
    assert run.exported["grants"] == [{"bucket": "acme-eval", "prefix": "eval/", "write": False}]
    out = run.exported["datasets"]["eval"]
    assert out["bucket_arn"] == "arn:aws:s3:::acme-eval" and out["existing"] is True


def test_existing_bucket_with_checkpoint_prefix_gets_write_there_only(base_config: dict[str, Any]) -> None:
    run = run_store(spec_with(base_config, {"name": "shared", "bucket_name": "acme-shared", "existing": True,
                                            "checkpoint_prefix": "team/ckpt/"}))
    assert run.exported["grants"] == [{"bucket": "acme-shared", "prefix": "", "write": False},
                                      {"bucket": "acme-shared", "prefix": "team/ckpt/", "write": True}]


# ------------------------------------------------------------------------------- FSx


@pytest.fixture(scope="module")
def lustre() -> Run:
    return run_store(spec_with(copy.deepcopy(BASE_CONFIG), {
        "name": "corpus", "bucket_name": "acme-corpus", "prefix": "data/", "checkpoint_prefix": "ckpt/",
        "access": "fsx", "fsx": {"availability_zone": "us-east-1b"}}))


def test_fsx_is_lustre_2_15_scratch_in_the_zone_subnet(lustre: Run) -> None:
    fs = lustre.one(FS)
    assert fs.inputs["deploymentType"] == "SCRATCH_2"
    assert fs.inputs["storageCapacity"] == 1200
    assert fs.inputs["fileSystemTypeVersion"] == "2.15"  # 2.10 (SCRATCH_2's default) has no DRAs
    assert fs.inputs["subnetIds"] == SUBNET_B
    assert "perUnitStorageThroughput" not in fs.inputs and "skipFinalBackup" not in fs.inputs
    sg = lustre.one("aws:ec2/securityGroup:SecurityGroup")
    assert fs.inputs["securityGroupIds"] == [f"{sg.name}-id"]
    assert sg.inputs["vpcId"] == VPC and "ingress" not in sg.inputs and "egress" not in sg.inputs


def test_fsx_is_protected_and_retained_like_the_buckets(lustre: Run) -> None:
    fs = lustre.one(FS)
    assert fs.protect and fs.retain_on_delete
    # What the retained file system needs keeps working after `pulumi destroy`: its group and the
    # rules among its own file servers; the rules naming node groups go with the node groups.
    sg = lustre.one("aws:ec2/securityGroup:SecurityGroup")
    assert sg.retain_on_delete and not sg.protect
    rules = lustre.of(INGRESS) + lustre.of(EGRESS)
    kept = {r.name for r in rules if r.retain_on_delete}
    assert kept == {f"ds-corpus-fsx-{d}-self-{p}" for d in ("in", "out") for p in ("988", "1018-1023")}


def test_scratch_fsx_has_no_backup_settings(lustre: Run) -> None:
    assert "automaticBackupRetentionDays" not in lustre.one(FS).inputs


def test_fsx_is_created_after_its_lustre_rules() -> None:
    """CreateFileSystem checks the LNET rules synchronously: every one of them must exist first."""
    plan = shipped_plan("prod")
    fs = next(r for r in plan.resources if r.type == FS)
    rules = [r for r in plan.resources if r.type in (INGRESS, EGRESS) and "-fsx-" in r.name]
    # 988 and 1018-1023, both ways: among the file servers (4), and with each of prod's 2 node groups (8 each)
    assert len(rules) == 4 + 8 * len(plan.spec.node_groups) == 20
    missing = [r.name for r in rules if not plan.depends_on(fs, r)]
    assert not missing, f"FSx does not wait for {missing}"
    assert {f"gpu-prod-datasets-pretrain-corpus-fsx-in-self-{p}" for p in ("988", "1018-1023")} <= set(
        fs.dependencies)


def test_fsx_associations_import_data_and_export_checkpoints(lustre: Run) -> None:
    fs_id = lustre.exported["datasets"]["corpus"]["fsx_file_system_id"]
    data = lustre.one(DRA, "ds-corpus-fsx-data").inputs
    assert (data["dataRepositoryPath"], data["fileSystemPath"]) == ("s3://acme-corpus/data/", "/data")
    assert data["fileSystemId"] == fs_id and data["batchImportMetaDataOnCreate"] is True
    assert data["s3"] == {"autoImportPolicy": {"events": ["NEW", "CHANGED", "DELETED"]}}
    assert data["deleteDataInFilesystem"] is False
    ckpt = lustre.one(DRA, "ds-corpus-fsx-checkpoints").inputs
    assert (ckpt["dataRepositoryPath"], ckpt["fileSystemPath"]) == ("s3://acme-corpus/ckpt/", "/checkpoints")
    assert ckpt["s3"]["autoExportPolicy"] == {"events": ["NEW", "CHANGED"]}, "never export deletions"
    assert ckpt["batchImportMetaDataOnCreate"] is True


def test_fsx_security_group_allows_lustre_ports_with_the_nodes_only(lustre: Run) -> None:
    fsx_sg = f"{lustre.one('aws:ec2/securityGroup:SecurityGroup').name}-id"
    rules = {(r.type, r.inputs["securityGroupId"], r.inputs["referencedSecurityGroupId"],
              r.inputs["ipProtocol"], r.inputs["fromPort"], r.inputs["toPort"])
             for r in lustre.of(INGRESS) + lustre.of(EGRESS)}
    expected = {
        (kind, group, peer, "tcp", low, high)
        for low, high in ((988, 988), (1018, 1023))
        for kind, group, peer in (
            (INGRESS, fsx_sg, fsx_sg), (EGRESS, fsx_sg, fsx_sg),      # between file servers
            (INGRESS, fsx_sg, NODE_SG), (EGRESS, fsx_sg, NODE_SG),    # file servers <-> nodes
            (INGRESS, NODE_SG, fsx_sg), (EGRESS, NODE_SG, fsx_sg),    # the nodes' side
        )
    }
    assert rules == expected
    assert len(lustre.of(INGRESS) + lustre.of(EGRESS)) == 12
    assert not any("cidrIpv4" in r.inputs for r in lustre.of(INGRESS) + lustre.of(EGRESS))


def test_fsx_mount_and_outputs_carry_dns_and_mount_names(lustre: Run) -> None:
    out = lustre.exported["datasets"]["corpus"]
    fs_id = out["fsx_file_system_id"]
    assert out["fsx_dns_name"] == f"{fs_id}.fsx.us-east-1.amazonaws.com"
    assert out["fsx_availability_zone"] == "us-east-1b"
    assert out["bucket_arn"] == "arn:aws:s3:::acme-corpus"
    assert lustre.exported["mounts"] == [{
        "name": "corpus", "access": "fsx", "bucket": "acme-corpus", "prefix": "data/", "path": "/fsx",
        "dns": out["fsx_dns_name"], "mount_name": out["fsx_mount_name"]}]
    assert out["fsx_mount_name"]


def test_fsx_zone_defaults_to_the_first_node_group_zone(base_config: dict[str, Any]) -> None:
    fsx = {"deployment_type": "PERSISTENT_2", "storage_capacity_gib": 4800, "throughput_per_unit_mib": 250}
    run = run_store(spec_with(base_config, {"name": "corpus", "prefix": "data/", "access": "fsx", "fsx": fsx},
                              availability_zones=["us-east-1b", "us-east-1a"]))
    fs = run.one(FS)
    assert fs.inputs["subnetIds"] == SUBNET_B
    assert (fs.inputs["deploymentType"], fs.inputs["storageCapacity"],
            fs.inputs["perUnitStorageThroughput"]) == ("PERSISTENT_2", 4800, 250)
    assert fs.inputs["skipFinalBackup"] is False, "a persistent file system leaves a final backup"
    assert fs.inputs["automaticBackupRetentionDays"] == 7, "and keeps a week of daily backups"
    assert [r.name for r in run.of(DRA)] == ["ds-corpus-fsx-data"]  # no checkpoint prefix, no export


def test_persistent_fsx_backup_retention_is_configurable(base_config: dict[str, Any]) -> None:
    fsx = {"deployment_type": "PERSISTENT_2", "throughput_per_unit_mib": 250,
           "automatic_backup_retention_days": 30}
    run = run_store(spec_with(base_config, {"name": "corpus", "access": "fsx", "fsx": fsx}))
    assert run.one(FS).inputs["automaticBackupRetentionDays"] == 30


PERSISTENT = {"deployment_type": "PERSISTENT_2", "throughput_per_unit_mib": 250}


@pytest.mark.parametrize(("fsx", "message"), [
    ({**PERSISTENT, "automatic_backup_retention_days": 0}, "keeps automatic backups: 1-90 days, got 0"),
    ({"automatic_backup_retention_days": 7}, "SCRATCH_2 file systems have no backups"),
    ({**PERSISTENT, "automatic_backup_retention_days": 91}, "must be 0..90, got 91"),
])
def test_fsx_backup_retention_rules(base_config: dict[str, Any], fsx: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_with(base_config, {"name": "corpus", "access": "fsx", "fsx": fsx})
    assert [(f.path, message in f.message) for f in err.value.findings] == [
        ("datasets[0].fsx.automatic_backup_retention_days", True)]


LUSTRE_KEY = "0123456789ABCDEF0123456789ABCDEF01234567"


def test_the_lustre_client_key_pin_reaches_every_node(base_config: dict[str, Any]) -> None:
    """fsx.client_key_fingerprints -> the node group's data mount -> node.env, which install.sh reads."""
    config = copy.deepcopy(base_config)
    config["gpucluster:datasets"] = [{"name": "corpus", "access": "fsx",
                                      "fsx": {"client_key_fingerprints": [LUSTRE_KEY]}}]
    spec = parse_stack_config(config, stack="test")
    plan = run_program("test", config, spec)
    [template] = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    script = gzip.decompress(base64.b64decode(template.inputs["userData"])).decode()
    assert f"GPUCLUSTER_LUSTRE_KEY_FINGERPRINTS={LUSTRE_KEY}\n" in script
    assert stack_warnings(spec) == []


def test_an_unpinned_lustre_client_key_is_a_warning(base_config: dict[str, Any]) -> None:
    spec = spec_with(base_config, {"name": "corpus", "access": "fsx", "fsx": {}})
    [warning] = stack_warnings(spec)
    assert (warning.path, warning.level) == ("datasets[0].fsx.client_key_fingerprints", "warning")
    assert "nodes trust the apt key AWS serves over TLS unchecked; pin it" in warning.message


@pytest.mark.parametrize("value", ["0123 4567 89AB CDEF 0123 4567 89AB CDEF 0123 4567", "abc", "0" * 41])
def test_a_lustre_client_key_pin_is_a_full_fingerprint(base_config: dict[str, Any], value: str) -> None:
    with pytest.raises(SpecError) as err:
        spec_with(base_config, {"name": "corpus", "access": "fsx",
                                "fsx": {"client_key_fingerprints": [value]}})
    [finding] = err.value.findings
    assert finding.path == "datasets[0].fsx.client_key_fingerprints[0]"
    assert "must be an OpenPGP key fingerprint: 40 upper-case hex digits without spaces" in finding.message


def test_fsx_on_an_existing_bucket_leaves_its_notifications_alone(base_config: dict[str, Any]) -> None:
    run = run_store(spec_with(base_config, {
        "name": "shared", "bucket_name": "acme-shared", "existing": True, "prefix": "corpus/",
        "checkpoint_prefix": "ckpt/", "access": "fsx", "fsx": {}}))
    data = run.one(DRA, "ds-shared-fsx-data").inputs
    assert data["dataRepositoryPath"] == "s3://acme-shared/corpus/" and "s3" not in data
    ckpt = run.one(DRA, "ds-shared-fsx-checkpoints").inputs
    assert ckpt["s3"] == {"autoExportPolicy": {"events": ["NEW", "CHANGED"]}}
    assert not run.of(BUCKET) and not [r for r in run.resources if r.type in S3_CONFIG]


def test_missing_subnet_for_the_fsx_zone_is_a_clear_error(base_config: dict[str, Any]) -> None:
    spec = spec_with(base_config, {"name": "corpus", "access": "fsx", "fsx": {}})
    with pytest.raises(Exception, match=r"no subnet for FSx zone 'us-east-1a' of dataset 'corpus'"):
        run_store(spec, subnets={"us-east-1b": SUBNET_B})


# ----------------------------------------------------------------------- shipped stacks


def test_prod_main_dataset_goes_through_persistent_fsx() -> None:
    _, _, spec = load_stack("prod")
    run = run_store(spec, subnets={"us-east-1d": SUBNET_D})
    fs = run.one(FS)
    assert (fs.inputs["deploymentType"], fs.inputs["storageCapacity"],
            fs.inputs["perUnitStorageThroughput"], fs.inputs["subnetIds"]) == ("PERSISTENT_2", 9600, 500,
                                                                               SUBNET_D)
    corpus = run.exported["datasets"]["pretrain-corpus"]
    assert corpus["access"] == "fsx" and corpus["fsx_dns_name"].endswith(".fsx.us-east-1.amazonaws.com")
    name = corpus["bucket_name"]
    assert {(g["bucket"], g["prefix"], g["write"]) for g in run.exported["grants"]} == {
        (name, "corpus/v3/", False), (name, "checkpoints/", True),
        ("acme-ml-eval-sets", "eval/", False)}
    assert run.exported["datasets"]["eval-sets"]["path"] == "/scratch/eval-sets"


def test_dev_mounts_its_dataset_with_mountpoint() -> None:
    _, _, spec = load_stack("dev")
    run = run_store(spec)
    assert not run.of(FS)
    assert run.exported["mounts"][0]["access"] == "mount"
    assert run.exported["mounts"][0]["path"] == "/data/dev-data"


# ------------------------------------------------------------------------- pure helpers


@pytest.mark.parametrize(("region", "partition"), [("us-east-1", "aws"), ("eu-west-1", "aws"),
                                                   ("cn-north-1", "aws-cn"), ("us-gov-west-1", "aws-us-gov")])
def test_partition_and_bucket_arn(region: str, partition: str) -> None:
    assert partition_of(region) == partition
    assert bucket_arn("b-1", region) == f"arn:{partition}:s3:::b-1"


def test_s3_url_and_policy_shape() -> None:
    assert s3_url("b", "") == "s3://b/" and s3_url("b", "x/y/") == "s3://b/x/y/"
    statement = json.loads(tls_only_policy("arn:aws:s3:::b"))["Statement"][0]
    assert statement["Resource"] == ["arn:aws:s3:::b", "arn:aws:s3:::b/*"]
