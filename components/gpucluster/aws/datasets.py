"""S3 datasets and how they reach the GPUs: buckets, FSx for Lustre, and the grants nodes need.

It owns the buckets a stack creates (encrypted, versioned, private, TLS-only,
with object versions and the bucket deletable only by a break-glass role, and
lifecycle rules that only expire *old versions* under the checkpoint prefix and
abandoned multipart uploads), references to existing buckets, the
FSx for Lustre file systems linked to them, and the S3 grants a bucket hands
the node IAM (`S3Grant`: read the data prefix, write the checkpoints). It must never delete
or rewrite data: a created bucket and every resource configuring it are
protected and retained on delete, so is a file system (a persistent one keeps
automatic backups), an existing bucket is never created, imported or
reconfigured, and no deletion on a file system is exported to S3.
"""

import json
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import (
    DatasetBucketModel,
    LustreFileSystemModel,
    bucket_checks,
    component_options,
    lustre_checks,
    type_token,
    validate,
)
from gpucluster.aws.settings import DatasetSettings
from gpucluster.noderole import dataset_grants
from gpucluster.parts import S3Grant
from gpucluster.spec import DatasetConfig, generated_bucket_prefix, partition_of

# FSx for Lustre user guide, "File system access control with Amazon VPC": Lustre uses TCP 988
# and 1018-1023, between file servers and clients in both directions and among the file servers.
LUSTRE_PORTS: tuple[tuple[int, int], ...] = ((988, 988), (1018, 1023))
# The rules among the file servers themselves: kept with the (retained) file system.
SERVER_RULES = ("in-self", "out-self")
# FSx API reference, CreateDataRepositoryAssociation: DRAs work on every Lustre 2.12/2.15 file
# system except SCRATCH_1 (the Pulumi docs' "PERSISTENT_2 only" note predates this). CreateFileSystem
# FileSystemTypeVersion defaults SCRATCH_2 to 2.10, which has no DRAs, so the version is set.
LUSTRE_VERSION = "2.15"
FSX_DATA_DIR = "/data"
FSX_CHECKPOINT_DIR = "/checkpoints"
IMPORT_EVENTS = ["NEW", "CHANGED", "DELETED"]
# No DELETED: freeing Lustre space by deleting a checkpoint must not delete it from S3.
EXPORT_EVENTS = ["NEW", "CHANGED"]
# Spot interruptions leave checkpoint uploads half done; their parts are billed until aborted.
ABORT_MULTIPART_DAYS = 7
# S3 user guide, "Encryption": SSE-S3 (AES256) rather than SSE-KMS with the aws/s3 key: that key's
# policy admits every principal of the account through S3, so it adds no access control, while
# every GET of a dataset would cost a KMS request counted against the account's KMS rate quota.
SSE_ALGORITHM = "AES256"
DATASET_TAG = "gpucluster:dataset"
OLD_BUCKET_TYPE = "gpucluster:datasets:DatasetBucket"
OLD_LUSTRE_TYPE = "gpucluster:datasets:LustreFileSystem"
OLD_STORE_TYPE = "gpucluster:datasets:DatasetStore"
# What loses data for good on a versioned bucket (infra/bootstrap-state DATA_DELETION, S3 part).
DATA_DELETION = ["s3:DeleteObjectVersion", "s3:DeleteBucket"]


def bucket_arn(bucket_name: str, region: str) -> str:
    """S3 bucket ARNs carry neither region nor account: arn:<partition>:s3:::<name>."""
    return f"arn:{partition_of(region)}:s3:::{bucket_name}"


def s3_url(bucket_name: str, prefix: str) -> str:
    """The form FSx data repository paths take: s3://bucket/prefix/ (prefix may be empty)."""
    return f"s3://{bucket_name}/{prefix}"


def tls_only_policy(arn: str) -> str:
    """Bucket policy denying every request not made over TLS (S3 security best practices)."""
    return bucket_policy(arn, deletion=False)


def bucket_policy(arn: str, break_glass_role_arn: str | None = None, *, deletion: bool = True) -> str:
    """The created bucket's policy: TLS only, and deleting data only by the break-glass role.

    Deleting an object version or the bucket is denied to every principal but
    `break_glass_role_arn` (to everyone without one), whatever their own policies
    allow: a plain DeleteObject on a versioned bucket only adds a delete marker, so
    data is lost only through these. What Pulumi manages stays deployable (versioning,
    lifecycle, this policy), and lifecycle expiry of old checkpoint versions is done by
    S3 itself, which a bucket policy does not stop (S3 API reference,
    PutBucketLifecycleConfiguration: to stop deletion, deny s3:PutLifecycleConfiguration too).
    """
    statements: list[dict[str, Any]] = [{
        "Sid": "DenyInsecureTransport",
        "Effect": "Deny",
        "Principal": "*",
        "Action": "s3:*",
        "Resource": [arn, f"{arn}/*"],
        "Condition": {"Bool": {"aws:SecureTransport": "false"}},
    }]
    if deletion:
        deny: dict[str, Any] = {"Sid": "DataDeletionNeedsBreakGlass", "Effect": "Deny", "Principal": "*",
                                "Action": DATA_DELETION, "Resource": [arn, f"{arn}/*"]}
        if break_glass_role_arn:
            # aws:PrincipalArn of a role session is the role's ARN (IAM user guide, "AWS global
            # condition context keys"), as in infra/bootstrap-state's boundaries.
            deny["Condition"] = {"ArnNotEquals": {"aws:PrincipalArn": break_glass_role_arn}}
        statements.append(deny)
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


def role_arn(region: str, account: str, role_name: str) -> str:
    return f"arn:{partition_of(region)}:iam::{account}:role/{role_name}"


def lifecycle_rules(dataset: DatasetConfig) -> "list[aws.s3.BucketLifecycleConfigurationRuleArgsDict]":
    """Abort stale multipart uploads everywhere; expire only noncurrent checkpoint versions.

    No rule has an `expiration` block: current objects are never expired by us.
    """
    rules: list[aws.s3.BucketLifecycleConfigurationRuleArgsDict] = [{
        "id": "abort-incomplete-multipart-uploads",
        "status": "Enabled",
        "filter": {"prefix": ""},
        "abort_incomplete_multipart_upload": {"days_after_initiation": ABORT_MULTIPART_DAYS},
    }]
    if dataset.checkpoint_prefix:
        rules.append({
            "id": "expire-noncurrent-checkpoint-versions",
            "status": "Enabled",
            "filter": {"prefix": dataset.checkpoint_prefix},
            # S3 keeps the newest `newer_noncurrent_versions` old versions whatever their age: a
            # node that keeps overwriting a checkpoint cannot age the whole history out (S3 user
            # guide, "Lifecycle configuration elements", NoncurrentVersionExpiration).
            "noncurrent_version_expiration": {
                "noncurrent_days": dataset.noncurrent_version_expiration_days,
                "newer_noncurrent_versions": dataset.newer_noncurrent_versions},
        })
    return rules


def grants_for(dataset: DatasetConfig, bucket_name: Any) -> list[S3Grant]:
    """Read the data prefix; read and write the checkpoint prefix; nothing else in the bucket; and
    only while the bucket belongs to `expected_bucket_owner` (None: the deploying account).

    A write grant includes listing and reading its prefix (components/gpucluster/noderole.py), so
    the checkpoint prefix needs no read grant of its own.
    """
    return dataset_grants(bucket_name, dataset.prefix, dataset.checkpoint_prefix,
                          dataset.expected_bucket_owner)


class DatasetBucketArgs(TypedDict):
    """One dataset's S3 bucket: created encrypted, versioned, private and protected, or an existing one."""

    dataset: DatasetSettings
    """The dataset as a stack file's datasets entry spells it."""
    cluster_name: str
    """Short name; an unnamed created bucket is named `<cluster_name>-<dataset>-<suffix>`."""
    region: str
    """AWS region, e.g. us-east-1 (the ARN partition of an existing bucket)."""
    tags: NotRequired[dict[str, str]]
    """Tags of the created bucket (the dataset's name is added as gpucluster:dataset)."""
    break_glass_role: NotRequired[str]
    """Name of the only role that may delete object versions or the created bucket (default: none may)."""


class DatasetBucket(pulumi.ComponentResource):
    """One dataset's bucket: created and locked down, or an existing bucket referenced by name.

    Python users also get `grants` (the `parts.S3Grant`s nodes need: read the data prefix,
    write the checkpoint prefix), `bucket_owner` (the account nodes expect to own the bucket: the
    deploying one, or an existing bucket's `expected_bucket_owner`) and `dataset` (the settings).
    """

    bucket_name: pulumi.Output[str]
    """The bucket's name, known once the bucket is fully configured (encryption, policy, versioning)."""
    bucket_arn: pulumi.Output[str]
    """The bucket's ARN."""

    def __init__(self, name: str, args: DatasetBucketArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        m = validate("DatasetBucket", name, DatasetBucketModel, args, bucket_checks)
        super().__init__(type_token("DatasetBucket"), name, None, component_options(opts, OLD_BUCKET_TYPE))
        dataset = self.dataset = m.dataset
        account = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self)).account_id
        self.bucket_owner: pulumi.Output[str] = pulumi.Output.from_input(
            dataset.expected_bucket_owner) if dataset.expected_bucket_owner else account
        if dataset.existing:
            if dataset.bucket_name is None:  # the args' checks guarantee it; keep mypy honest
                raise ValueError(f"datasets: existing dataset {dataset.name!r} has no bucket_name")
            self.bucket_name = pulumi.Output.from_input(dataset.bucket_name)
            self.bucket_arn = pulumi.Output.from_input(bucket_arn(dataset.bucket_name, m.region))
        else:
            self._create(name, m, account)
        self.grants = grants_for(dataset, self.bucket_name)
        self.register_outputs({"bucket_name": self.bucket_name, "bucket_arn": self.bucket_arn})

    def _protected(self, *depends_on: pulumi.Resource) -> pulumi.ResourceOptions:
        """`pulumi destroy` refuses, and even after `pulumi state unprotect` only forgets."""
        return pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True,
                                      depends_on=list(depends_on))

    def _create(self, name: str, m: DatasetBucketModel, account: pulumi.Output[str]) -> None:
        dataset = m.dataset
        bucket = aws.s3.Bucket(
            f"{name}-bucket",
            bucket=dataset.bucket_name,
            bucket_prefix=None if dataset.bucket_name else generated_bucket_prefix(
                m.cluster_name, dataset.name),
            force_destroy=False,
            tags={**m.tags, DATASET_TAG: dataset.name},
            opts=self._protected())
        ownership = aws.s3.BucketOwnershipControls(
            f"{name}-ownership", bucket=bucket.id,
            rule={"object_ownership": "BucketOwnerEnforced"},  # ACLs off: IAM and policy decide
            opts=self._protected())
        public_access = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access", bucket=bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=self._protected())
        encryption = aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption", bucket=bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": SSE_ALGORITHM}}],
            opts=self._protected())
        versioning = aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=bucket.id, versioning_configuration={"status": "Enabled"},
            opts=self._protected())
        role = m.break_glass_role
        # The resource keeps its first name (`-tls-only`): it is protected, and a new name would
        # replace it.
        policy = aws.s3.BucketPolicy(
            f"{name}-tls-only", bucket=bucket.id,
            policy=pulumi.Output.all(bucket.arn, account).apply(
                lambda v: bucket_policy(v[0], role_arn(m.region, v[1], role) if role else None)),
            opts=self._protected(public_access))
        # Noncurrent-version rules act on a versioned bucket (pulumi-aws BucketLifecycleConfiguration docs).
        lifecycle = aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle", bucket=bucket.id, rules=lifecycle_rules(dataset),
            opts=self._protected(versioning))
        # Whatever uses the name (node IAM, FSx associations) waits for the whole configuration,
        # as a dependency on this component did before these were Outputs.
        configured = [r.id for r in (ownership, public_access, encryption, versioning, policy, lifecycle)]
        self.bucket_name = pulumi.Output.all(bucket.bucket, *configured).apply(lambda v: v[0])
        self.bucket_arn = pulumi.Output.all(bucket.arn, *configured).apply(lambda v: v[0])


class LustreFileSystemArgs(TypedDict):
    """FSx for Lustre in one subnet, linked to a dataset's bucket, reachable from the given node groups."""

    dataset: DatasetSettings
    """The dataset as a stack file's datasets entry spells it, with its fsx settings."""
    bucket_name: pulumi.Input[str]
    """The dataset's bucket (data repository associations link its prefixes)."""
    vpc_id: pulumi.Input[str]
    """The VPC of the file system's security group."""
    subnet_id: pulumi.Input[str]
    """The one subnet the file system lives in (put it in the zone of the nodes that use it)."""
    node_security_group_ids: NotRequired[dict[str, pulumi.Input[str]]]
    """Node group name -> its nodes' security group: Lustre traffic is allowed both ways with each."""
    tags: NotRequired[dict[str, str]]
    """Tags of every resource (the dataset's name is added as gpucluster:dataset)."""


class LustreFileSystem(pulumi.ComponentResource):
    """FSx for Lustre in one subnet, linked to a dataset's bucket by data repository associations.

    `<mount>/data` holds the data prefix (imported on create, kept in step with S3 for created
    buckets), `<mount>/checkpoints` the checkpoint prefix (imported, and exported back to S3).
    """

    file_system_id: pulumi.Output[str]
    """The file system's id."""
    dns_name: pulumi.Output[str]
    """The DNS name nodes mount."""
    mount_name: pulumi.Output[str]
    """The Lustre mount name (mount <dns_name>@tcp:/<mount_name>)."""
    security_group_id: pulumi.Output[str]
    """The file system's own security group."""

    def __init__(self, name: str, args: LustreFileSystemArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        m = validate("LustreFileSystem", name, LustreFileSystemModel, args, lustre_checks)
        super().__init__(type_token("LustreFileSystem"), name, None, component_options(opts, OLD_LUSTRE_TYPE))
        dataset, fsx = m.dataset, m.dataset.fsx
        assert fsx is not None  # lustre_checks require it
        child = pulumi.ResourceOptions(parent=self)
        tags = {**m.tags, DATASET_TAG: dataset.name}
        # The file system outlives `pulumi destroy` (it is retained), so its security group and the
        # rules between its own file servers stay with it; only the rules naming node groups go.
        group = aws.ec2.SecurityGroup(
            f"{name}-sg", vpc_id=m.vpc_id,
            description=f"FSx for Lustre of dataset {dataset.name}: Lustre traffic with the GPU nodes",
            tags={**tags, "Name": f"{name}-sg"},
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True))
        rules = self._lustre_rules(name, group.id, m.node_security_group_ids, tags)
        persistent = fsx.deployment_type == "PERSISTENT_2"
        file_system = aws.fsx.LustreFileSystem(
            f"{name}-fs",
            deployment_type=fsx.deployment_type,
            storage_capacity=fsx.storage_capacity_gib,
            per_unit_storage_throughput=fsx.throughput_per_unit_mib if persistent else None,
            file_system_type_version=LUSTRE_VERSION,
            subnet_ids=m.subnet_id,
            security_group_ids=[group.id],
            # Scratch file systems have no backups; a persistent one keeps daily automatic backups
            # and leaves a final backup on delete.
            automatic_backup_retention_days=fsx.automatic_backup_retention_days if persistent else None,
            skip_final_backup=False if persistent else None,
            copy_tags_to_backups=True if persistent else None,
            tags={**tags, "Name": f"{name}-fs"},
            # CreateFileSystem checks synchronously that the security group admits Lustre (TCP 988,
            # 1018-1023) and fails otherwise (FSx for Lustre user guide, "You can't create a file
            # system because of a misconfigured security group"; aws-parallelcluster#6181): the
            # rules come first. Protected and retained on delete like the buckets: data is never
            # deleted by Pulumi.
            opts=pulumi.ResourceOptions(parent=self, depends_on=rules, protect=True, retain_on_delete=True))
        bucket_name = pulumi.Output.from_input(m.bucket_name)
        existing = dataset.existing
        data = aws.fsx.DataRepositoryAssociation(
            f"{name}-data",
            file_system_id=file_system.id,
            file_system_path=FSX_DATA_DIR,
            data_repository_path=bucket_name.apply(lambda b: s3_url(b, dataset.prefix)),
            batch_import_meta_data_on_create=True,
            delete_data_in_filesystem=False,
            # Auto-import makes FSx add an event notification to the bucket: only to ours.
            s3=None if existing else {"auto_import_policy": {"events": IMPORT_EVENTS}},
            tags=tags,
            opts=child)
        if dataset.checkpoint_prefix:
            checkpoint_prefix = dataset.checkpoint_prefix
            s3: aws.fsx.DataRepositoryAssociationS3ArgsDict = {
                "auto_export_policy": {"events": EXPORT_EVENTS}}
            if not existing:
                s3["auto_import_policy"] = {"events": IMPORT_EVENTS}
            aws.fsx.DataRepositoryAssociation(
                f"{name}-checkpoints",
                file_system_id=file_system.id,
                file_system_path=FSX_CHECKPOINT_DIR,
                data_repository_path=bucket_name.apply(lambda b: s3_url(b, checkpoint_prefix)),
                batch_import_meta_data_on_create=True,  # resume from checkpoints already in S3
                delete_data_in_filesystem=False,
                s3=s3,
                tags=tags,
                # FSx works one association request at a time per file system.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[data]))
        self.file_system_id = file_system.id
        self.dns_name = file_system.dns_name
        self.mount_name = file_system.mount_name
        self.security_group_id = group.id
        self.register_outputs({"file_system_id": self.file_system_id, "dns_name": self.dns_name,
                               "mount_name": self.mount_name, "security_group_id": self.security_group_id})

    def _lustre_rules(self, name: str, fsx_group: pulumi.Input[str],
                      node_groups: Mapping[str, pulumi.Input[str]],
                      tags: Mapping[str, str]) -> list[pulumi.Resource]:
        """Lustre ports between file servers, and both ways between file servers and each node group.

        Standalone rule resources, so the node security groups must not use inline rules. The
        rules between file servers are retained on delete with the file system they serve.
        """
        created: list[pulumi.Resource] = []
        for low, high in LUSTRE_PORTS:
            ports = str(low) if low == high else f"{low}-{high}"
            rules = [
                ("in-self", aws.vpc.SecurityGroupIngressRule, fsx_group, fsx_group, "between file servers"),
                ("out-self", aws.vpc.SecurityGroupEgressRule, fsx_group, fsx_group, "between file servers"),
            ]
            for group_name, node_group in node_groups.items():
                rules += [
                    (f"in-{group_name}", aws.vpc.SecurityGroupIngressRule, fsx_group, node_group,
                     f"from GPU node group {group_name}"),
                    (f"out-{group_name}", aws.vpc.SecurityGroupEgressRule, fsx_group, node_group,
                     f"to GPU node group {group_name}"),
                    (f"{group_name}-in", aws.vpc.SecurityGroupIngressRule, node_group, fsx_group,
                     "from FSx for Lustre"),
                    (f"{group_name}-out", aws.vpc.SecurityGroupEgressRule, node_group, fsx_group,
                     "to FSx for Lustre"),
                ]
            for part, rule, group_id, peer, why in rules:
                created.append(rule(
                    f"{name}-{part}-{ports}", security_group_id=group_id, referenced_security_group_id=peer,
                    ip_protocol="tcp", from_port=low, to_port=high, description=f"Lustre TCP {ports} {why}",
                    tags={**tags, "Name": f"{name}-{part}-{ports}"},
                    opts=pulumi.ResourceOptions(parent=self, retain_on_delete=part in SERVER_RULES)))
        return created


class DatasetStore(pulumi.ComponentResource):
    """The parent of a GpuCluster's DatasetBuckets and LustreFileSystems (not part of the package).

    It holds no resources of its own: it keeps the URNs of the buckets (protected and retained)
    where they have always been, under `<cluster>-datasets`. GpuCluster builds the datasets under
    it and then calls `finish` with what they hand on.
    """

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("DatasetStore"), name, None, component_options(opts, OLD_STORE_TYPE))

    def finish(self, outputs: Mapping[str, Any]) -> None:
        self.register_outputs({"datasets": dict(outputs)})
