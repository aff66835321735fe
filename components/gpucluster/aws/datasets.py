"""S3 datasets and how they reach the GPUs: buckets, FSx for Lustre, node grants and data mounts.

It owns the buckets a stack creates (encrypted, versioned, private, TLS-only,
with lifecycle rules that only expire *old versions* under the checkpoint
prefix and abandoned multipart uploads), references to existing buckets, the
FSx for Lustre file systems linked to them, and the records handed on to the
node IAM (`S3Grant`) and the node bootstrap (`DataMount`). It must never delete
or rewrite data: a created bucket and every resource configuring it are
protected and retained on delete, an existing bucket is never created,
imported or reconfigured, and no deletion on a file system is exported to S3.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_aws as aws
from gpucluster.parts import DataMount, S3Grant
from gpucluster.spec import DatasetConfig, FsxConfig, StackSpec, dataset_path, generated_bucket_prefix

# FSx for Lustre user guide, "File system access control with Amazon VPC": Lustre uses TCP 988
# and 1018-1023, between file servers and clients in both directions and among the file servers.
LUSTRE_PORTS: tuple[tuple[int, int], ...] = ((988, 988), (1018, 1023))
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


def partition_of(region: str) -> str:
    """The ARN partition of a region (AWS general reference, "Amazon Resource Names")."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"


def bucket_arn(bucket_name: str, region: str) -> str:
    """S3 bucket ARNs carry neither region nor account: arn:<partition>:s3:::<name>."""
    return f"arn:{partition_of(region)}:s3:::{bucket_name}"


def s3_url(bucket_name: str, prefix: str) -> str:
    """The form FSx data repository paths take: s3://bucket/prefix/ (prefix may be empty)."""
    return f"s3://{bucket_name}/{prefix}"


def tls_only_policy(arn: str) -> str:
    """Bucket policy denying every request not made over TLS (S3 security best practices)."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "DenyInsecureTransport",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [arn, f"{arn}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }],
    })


def lifecycle_rules(dataset: DatasetConfig) -> list[dict[str, Any]]:
    """Abort stale multipart uploads everywhere; expire only noncurrent checkpoint versions.

    No rule has an `expiration` block: current objects are never expired by us.
    """
    rules: list[dict[str, Any]] = [{
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
            "noncurrent_version_expiration": {
                "noncurrent_days": dataset.noncurrent_version_expiration_days},
        })
    return rules


def grants_for(dataset: DatasetConfig, bucket_name: Any) -> list[S3Grant]:
    """Read the data prefix; read and write the checkpoint prefix; nothing else in the bucket.

    A write grant includes listing and reading its prefix (components/gpucluster/aws/iam.py), so the
    checkpoint prefix needs no read grant of its own.
    """
    grants = [S3Grant(bucket_name, dataset.prefix, write=False)]
    if dataset.checkpoint_prefix:
        grants.append(S3Grant(bucket_name, dataset.checkpoint_prefix, write=True))
    return grants


def fsx_zone(spec: StackSpec, fsx: FsxConfig) -> str:
    """fsx.availability_zone, or the first zone of the first node group."""
    return fsx.availability_zone or spec.azs_of(spec.node_groups[0])[0]


class DatasetBucket(pulumi.ComponentResource):
    """One dataset's bucket: created and locked down, or an existing bucket referenced by name."""

    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    grants: list[S3Grant]

    def __init__(self, name: str, dataset: DatasetConfig, spec: StackSpec,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpucluster:datasets:DatasetBucket", name, None, opts)
        self.dataset = dataset
        if dataset.existing:
            if dataset.bucket_name is None:  # spec validation guarantees it; keep mypy honest
                raise ValueError(f"datasets: existing dataset {dataset.name!r} has no bucket_name")
            self.bucket_name = pulumi.Output.from_input(dataset.bucket_name)
            self.bucket_arn = pulumi.Output.from_input(bucket_arn(dataset.bucket_name, spec.region))
        else:
            self._create(name, dataset, spec)
        self.grants = grants_for(dataset, self.bucket_name)
        self.register_outputs({"bucket_name": self.bucket_name, "bucket_arn": self.bucket_arn})

    def _protected(self, *depends_on: pulumi.Resource) -> pulumi.ResourceOptions:
        """`pulumi destroy` refuses, and even after `pulumi state unprotect` only forgets."""
        return pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True,
                                      depends_on=list(depends_on))

    def _create(self, name: str, dataset: DatasetConfig, spec: StackSpec) -> None:
        bucket = aws.s3.Bucket(
            f"{name}-bucket",
            bucket=dataset.bucket_name,
            bucket_prefix=None if dataset.bucket_name else generated_bucket_prefix(
                spec.cluster.name, dataset.name),
            force_destroy=False,
            tags={**spec.tags, "gpucluster:dataset": dataset.name},
            opts=self._protected())
        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        aws.s3.BucketOwnershipControls(
            f"{name}-ownership", bucket=bucket.id,
            rule={"object_ownership": "BucketOwnerEnforced"},  # ACLs off: IAM and policy decide
            opts=self._protected())
        public_access = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access", bucket=bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=self._protected())
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption", bucket=bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": SSE_ALGORITHM}}],
            opts=self._protected())
        versioning = aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=bucket.id, versioning_configuration={"status": "Enabled"},
            opts=self._protected())
        aws.s3.BucketPolicy(
            f"{name}-tls-only", bucket=bucket.id, policy=bucket.arn.apply(tls_only_policy),
            opts=self._protected(public_access))
        # Noncurrent-version rules act on a versioned bucket (pulumi-aws BucketLifecycleConfiguration docs).
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle", bucket=bucket.id, rules=lifecycle_rules(dataset),
            opts=self._protected(versioning))


class LustreFileSystem(pulumi.ComponentResource):
    """FSx for Lustre in one subnet, linked to a dataset's bucket by data repository associations.

    `<mount>/data` holds the data prefix (imported on create, kept in step with S3 for created
    buckets), `<mount>/checkpoints` the checkpoint prefix (imported, and exported back to S3).
    """

    file_system_id: pulumi.Output[str]
    dns_name: pulumi.Output[str]
    mount_name: pulumi.Output[str]
    security_group_id: pulumi.Output[str]

    def __init__(self, name: str, *, dataset: DatasetConfig, bucket: DatasetBucket,
                 subnet_id: pulumi.Input[str], vpc_id: pulumi.Input[str],
                 node_security_groups: Mapping[str, pulumi.Input[str]], tags: Mapping[str, str],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpucluster:datasets:LustreFileSystem", name, None, opts)
        if dataset.fsx is None:
            raise ValueError(f"datasets: dataset {dataset.name!r} has no fsx settings")
        fsx = dataset.fsx
        child = pulumi.ResourceOptions(parent=self)
        tags = {**tags, "gpucluster:dataset": dataset.name}
        group = aws.ec2.SecurityGroup(
            f"{name}-sg", vpc_id=vpc_id,
            description=f"FSx for Lustre of dataset {dataset.name}: Lustre traffic with the GPU nodes",
            tags={**tags, "Name": f"{name}-sg"}, opts=child)
        self._lustre_rules(name, group.id, node_security_groups, tags)
        persistent = fsx.deployment_type == "PERSISTENT_2"
        file_system = aws.fsx.LustreFileSystem(
            f"{name}-fs",
            deployment_type=fsx.deployment_type,
            storage_capacity=fsx.storage_capacity_gib,
            per_unit_storage_throughput=fsx.throughput_per_unit_mib if persistent else None,
            file_system_type_version=LUSTRE_VERSION,
            subnet_ids=subnet_id,
            security_group_ids=[group.id],
            # Scratch file systems have no backups; a persistent one leaves a final backup on delete.
            skip_final_backup=False if persistent else None,
            copy_tags_to_backups=True if persistent else None,
            tags={**tags, "Name": f"{name}-fs"},
            opts=child)
        existing = dataset.existing
        data = aws.fsx.DataRepositoryAssociation(
            f"{name}-data",
            file_system_id=file_system.id,
            file_system_path=FSX_DATA_DIR,
            data_repository_path=bucket.bucket_name.apply(lambda b: s3_url(b, dataset.prefix)),
            batch_import_meta_data_on_create=True,
            delete_data_in_filesystem=False,
            # Auto-import makes FSx add an event notification to the bucket: only to ours.
            s3=None if existing else {"auto_import_policy": {"events": IMPORT_EVENTS}},
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[bucket]))
        if dataset.checkpoint_prefix:
            checkpoint_prefix = dataset.checkpoint_prefix
            s3: dict[str, Any] = {"auto_export_policy": {"events": EXPORT_EVENTS}}
            if not existing:
                s3["auto_import_policy"] = {"events": IMPORT_EVENTS}
            aws.fsx.DataRepositoryAssociation(
                f"{name}-checkpoints",
                file_system_id=file_system.id,
                file_system_path=FSX_CHECKPOINT_DIR,
                data_repository_path=bucket.bucket_name.apply(lambda b: s3_url(b, checkpoint_prefix)),
                batch_import_meta_data_on_create=True,  # resume from checkpoints already in S3
                delete_data_in_filesystem=False,
                s3=s3,
                tags=tags,
                # FSx works one association request at a time per file system.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[bucket, data]))
        self.file_system_id = file_system.id
        self.dns_name = file_system.dns_name
        self.mount_name = file_system.mount_name
        self.security_group_id = group.id
        self.register_outputs({"file_system_id": self.file_system_id, "dns_name": self.dns_name,
                               "mount_name": self.mount_name, "security_group_id": self.security_group_id})

    def _lustre_rules(self, name: str, fsx_group: pulumi.Input[str],
                      node_groups: Mapping[str, pulumi.Input[str]], tags: Mapping[str, str]) -> None:
        """Lustre ports between file servers, and both ways between file servers and each node group.

        Standalone rule resources, so the node security groups must not use inline rules.
        """
        child = pulumi.ResourceOptions(parent=self)
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
                rule(f"{name}-{part}-{ports}", security_group_id=group_id, referenced_security_group_id=peer,
                     ip_protocol="tcp", from_port=low, to_port=high,
                     description=f"Lustre TCP {ports} {why}",
                     tags={**tags, "Name": f"{name}-{part}-{ports}"}, opts=child)


class DatasetStore(pulumi.ComponentResource):
    """Every dataset of a stack: buckets, FSx file systems, and what nodes get from them.

    `grants` go to the node IAM (exactly these buckets and prefixes), `mounts` to the node
    bootstrap, `outputs` (per dataset: bucket name and ARN, access, path, FSx names) to the stack.
    """

    grants: list[S3Grant]
    mounts: list[DataMount]
    outputs: dict[str, dict[str, Any]]

    def __init__(self, name: str, spec: StackSpec, *, vpc_id: pulumi.Input[str],
                 subnet_ids_by_az: Mapping[str, pulumi.Input[str]],
                 node_security_groups: Mapping[str, pulumi.Input[str]],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        """`node_security_groups`: node group name -> its security group id (FSx admits each)."""
        super().__init__("gpucluster:datasets:DatasetStore", name, None, opts)
        self.grants, self.mounts, self.outputs = [], [], {}
        child = pulumi.ResourceOptions(parent=self)
        for dataset in spec.datasets:
            bucket = DatasetBucket(f"{name}-{dataset.name}", dataset, spec, opts=child)
            path = dataset_path(spec, dataset)
            entry: dict[str, Any] = {"bucket_name": bucket.bucket_name, "bucket_arn": bucket.bucket_arn,
                                     "existing": dataset.existing, "access": dataset.access,
                                     "prefix": dataset.prefix, "checkpoint_prefix": dataset.checkpoint_prefix,
                                     "path": path}
            mount = DataMount(name=dataset.name, access=dataset.access, bucket_name=bucket.bucket_name,
                              prefix=dataset.prefix, path=path)
            if dataset.access == "fsx" and dataset.fsx is not None:
                zone = fsx_zone(spec, dataset.fsx)
                if zone not in subnet_ids_by_az:
                    raise ValueError(f"datasets: no subnet for FSx zone {zone!r} of dataset "
                                     f"{dataset.name!r}; subnets: {', '.join(sorted(subnet_ids_by_az))}")
                lustre = LustreFileSystem(
                    f"{name}-{dataset.name}-fsx", dataset=dataset, bucket=bucket,
                    subnet_id=subnet_ids_by_az[zone], vpc_id=vpc_id,
                    node_security_groups=node_security_groups, tags=spec.tags, opts=child)
                entry |= {"fsx_file_system_id": lustre.file_system_id, "fsx_dns_name": lustre.dns_name,
                          "fsx_mount_name": lustre.mount_name, "fsx_availability_zone": zone}
                mount = DataMount(name=dataset.name, access="fsx", bucket_name=bucket.bucket_name,
                                  prefix=dataset.prefix, path=path, fsx_dns_name=lustre.dns_name,
                                  fsx_mount_name=lustre.mount_name)
            self.grants.extend(bucket.grants)
            self.mounts.append(mount)
            self.outputs[dataset.name] = entry
        self.register_outputs({"datasets": self.outputs})
