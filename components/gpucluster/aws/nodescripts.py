"""NodeScripts: the stack's bucket of node scripts, and the bundle object every node boots from.

It owns where the shipped node scripts live once they are out of EC2 user data (16 KiB: see
`gpucluster.node.bundle`): one bucket per stack, set up like the dataset buckets (SSE-S3, versioned,
all public access blocked, ACLs off, a TLS-only policy that also keeps object versions and the
bucket from being deleted by anyone but the break-glass role, protected and retained on
`pulumi destroy`), holding `node-scripts/<sha256>.tar`, this package's bundle. Objects are
retained too: when the scripts change, the new digest is a new key and the old object stays, so a
launch template version that names it (a rollback, an instance refresh) still boots. Nodes read
only that prefix (`noderole.scripts_policy_document`) and check the digest their user data names.
It never touches another bucket and never deletes an object.
"""

import base64
from typing import NotRequired, TypedDict

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import NodeScriptsModel, owned_tags, type_token, validate
from gpucluster.aws.datasets import SSE_ALGORITHM, bucket_policy, role_arn
from gpucluster.node.bundle import BUNDLE_CONTENT_TYPE, bundle_bytes, bundle_key, bundle_sha256
from gpucluster.spec import generated_bucket_prefix

SCRIPTS_TAG = "gpucluster:purpose"
SCRIPTS_TAG_VALUE = "node-scripts"
BUCKET_PREFIX_PART = "node-scripts"
"""The bucket is named `<cluster>-node-scripts-<unique suffix>` (cut to S3's prefix limit)."""


class NodeScriptsArgs(TypedDict):
    """The stack's node-scripts bucket: who owns it, where, and who alone may delete from it."""

    cluster_name: str
    """Short name: the bucket is named `<cluster_name>-node-scripts-<suffix>`."""
    identity: str
    """The gpucluster:stack tag value of the bucket and the bundle object."""
    region: str
    """AWS region, e.g. us-east-1 (the bucket's partition)."""
    tags: NotRequired[dict[str, str]]
    """Tags of the bucket and the object."""
    break_glass_role: NotRequired[str]
    """Name of the only role that may delete object versions or the bucket (default: none may)."""


class NodeScripts(pulumi.ComponentResource):
    """A protected bucket holding the node scripts bundle that node groups' user data fetches.

    Pass `source` to GpuNodeGroupArgs.node_scripts and NodeIdentityArgs.node_scripts. Python users
    also get `bucket` (the `aws.s3.Bucket`) and `bundle` (the `aws.s3.BucketObjectv2`).
    """

    bucket_name: pulumi.Output[str]
    """The bucket's name, known once the bucket is configured and the bundle is in it."""
    bucket_arn: pulumi.Output[str]
    """The bucket's ARN."""
    bucket_owner: pulumi.Output[str]
    """The account owning the bucket (nodes fetch with --expected-bucket-owner)."""
    bundle_key: pulumi.Output[str]
    """The bundle's key: node-scripts/<sha256>.tar."""
    bundle_sha256: pulumi.Output[str]
    """The bundle's sha256, which every user data names and every node checks."""

    def __init__(self, name: str, args: NodeScriptsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        m = validate("NodeScripts", name, NodeScriptsModel, args)
        super().__init__(type_token("NodeScripts"), name, None, opts)  # new: no former type token
        tags = {**owned_tags(m.tags, m.identity, m.cluster_name), SCRIPTS_TAG: SCRIPTS_TAG_VALUE}
        account = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=self)).account_id

        def protected(*depends_on: pulumi.Resource) -> pulumi.ResourceOptions:
            # As the dataset buckets: `pulumi destroy` refuses, and after `state unprotect` only forgets.
            return pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True,
                                          depends_on=list(depends_on))

        self.bucket = aws.s3.Bucket(
            f"{name}-bucket", bucket_prefix=generated_bucket_prefix(m.cluster_name, BUCKET_PREFIX_PART),
            force_destroy=False, tags=tags, opts=protected())
        ownership = aws.s3.BucketOwnershipControls(
            f"{name}-ownership", bucket=self.bucket.id, rule={"object_ownership": "BucketOwnerEnforced"},
            opts=protected())
        public_access = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access", bucket=self.bucket.id, block_public_acls=True, block_public_policy=True,
            ignore_public_acls=True, restrict_public_buckets=True, opts=protected())
        # SSE-S3, as the dataset buckets (aws/datasets.py SSE_ALGORITHM): the aws/s3 key would add no
        # access control and a KMS request to every node's boot.
        encryption = aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption", bucket=self.bucket.id,
            rules=[{"apply_server_side_encryption_by_default": {"sse_algorithm": SSE_ALGORITHM}}],
            opts=protected())
        versioning = aws.s3.BucketVersioning(
            f"{name}-versioning", bucket=self.bucket.id, versioning_configuration={"status": "Enabled"},
            opts=protected())
        role = m.break_glass_role
        policy = aws.s3.BucketPolicy(
            f"{name}-policy", bucket=self.bucket.id,
            policy=pulumi.Output.all(self.bucket.arn, account).apply(
                lambda v: bucket_policy(v[0], role_arn(m.region, v[1], role) if role else None)),
            opts=protected(public_access))
        key, digest = bundle_key(), bundle_sha256()
        # S3 stores and checks the object's own SHA-256 on upload (S3 user guide, "Checking object
        # integrity"); the node checks the whole object's digest again against its user data.
        self.bundle = aws.s3.BucketObjectv2(
            f"{name}-bundle", bucket=self.bucket.id, key=key,
            content_base64=base64.b64encode(bundle_bytes()).decode(), content_type=BUNDLE_CONTENT_TYPE,
            checksum_algorithm="SHA256", server_side_encryption=SSE_ALGORITHM, tags=tags,
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True,
                                        depends_on=[ownership, encryption, versioning, policy]))
        configured = [r.id for r in (ownership, public_access, encryption, versioning, policy, self.bundle)]
        self.bucket_name = pulumi.Output.all(self.bucket.bucket, *configured).apply(lambda v: v[0])
        self.bucket_arn = pulumi.Output.all(self.bucket.arn, *configured).apply(lambda v: v[0])
        self.bucket_owner = account
        self.bundle_key = pulumi.Output.from_input(key)
        self.bundle_sha256 = pulumi.Output.from_input(digest)
        self.source = {"bucket_name": self.bucket_name, "owner": self.bucket_owner}
        self.register_outputs({"bucket_name": self.bucket_name, "bucket_arn": self.bucket_arn,
                               "bucket_owner": self.bucket_owner, "bundle_key": self.bundle_key,
                               "bundle_sha256": self.bundle_sha256})
