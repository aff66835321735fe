"""Node identity: the IAM role and instance profile every GPU node of a cluster runs as.

It owns what nodes may do in AWS: be managed through SSM (no SSH), publish
metrics into their cluster's own CloudWatch namespace, read the stack's dataset
buckets and write only under their checkpoint prefixes, and only while each bucket
belongs to the account expected. The documents are built by `gpucluster.noderole`
(pure, so the spec sizes them before anything deploys); S3 access comes from
`BucketGrant`s (a bucket name, plain or an Output, a prefix and the owner), always
naming the bucket and prefix: never a `*` resource, never a delete action.
"""

import json
from typing import NotRequired, TypedDict

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import (
    NodeIdentityModel,
    NodeScriptsSource,
    component_options,
    identity_checks,
    type_token,
    validate,
)
from gpucluster.noderole import (
    PCS_IAM_PATH,
    agent_policy_document,
    gpu_metric_namespace,
    jobs_policy_document,
    pcs_register_policy_document,
    s3_policy_document,
    scripts_policy_document,
)

# AWS managed policies: Systems Manager user guide ("Configure instance permissions"). The CloudWatch
# agent's CloudWatchAgentServerPolicy is replaced by the scoped `agent` inline policy: it let any
# process publish any metric, write and re-time any log group and read AmazonCloudWatch-* parameters.
MANAGED_POLICIES = {
    "ssm": "AmazonSSMManagedInstanceCore",
}
# What a node of an EKS stack also needs: join the cluster, pull images from ECR, and run the VPC CNI
# (Amazon EKS user guide, "Amazon EKS node IAM role"; ledger: eks-cluster-role-policies). No OIDC provider:
# pods that need AWS use EKS Pod Identity.
EKS_NODE_POLICIES = {"eks-worker": "AmazonEKSWorkerNodePolicy",
                     "eks-ecr": "AmazonEC2ContainerRegistryReadOnly", "eks-cni": "AmazonEKS_CNI_Policy"}
OLD_TYPE = "gpucluster:iam:NodeIdentity"


def assume_role_policy() -> str:
    """Trust policy: only EC2 instances may take the role."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                       "Action": "sts:AssumeRole"}],
    })


def boundary_arn(partition: pulumi.Input[str], account: pulumi.Input[str], name: str) -> pulumi.Output[str]:
    """A customer managed policy of this account, by name (what `permissions_boundary` takes)."""
    return pulumi.Output.concat("arn:", partition, ":iam::", account, ":policy/", name)


class BucketGrant(TypedDict):
    """Node access to one bucket: read under `prefix`, and with `write` also write there."""

    bucket_name: pulumi.Input[str]
    """The bucket."""
    prefix: NotRequired[str]
    """Folder-like prefix ending in '/'; empty (the default) means the whole bucket, read-only."""
    write: NotRequired[bool]
    """Also put objects (and multipart uploads) under the prefix; never delete."""
    expected_bucket_owner: NotRequired[str]
    """The 12-digit account that must own the bucket (default: the deploying account)."""


class NodeIdentityArgs(TypedDict):
    """The IAM role and instance profile of GPU nodes, with S3 access to exactly the given prefixes."""

    cluster_name: str
    """The cluster's short name: nodes publish metrics only into the namespace gpucluster/<cluster_name>."""
    s3_grants: NotRequired[list[BucketGrant]]
    """Buckets and prefixes nodes may read (and write, where `write` is set)."""
    tags: NotRequired[dict[str, str]]
    """Tags of the role and the instance profile."""
    permissions_boundary: NotRequired[str]
    """Name of a customer managed policy the role carries as its permissions boundary."""
    run_log_group: NotRequired[str]
    """The stack's run log group (its name): the only log group nodes may write job output to."""
    container_images: NotRequired[list[str]]
    """The node groups' container images: nodes may pull those in private ECR (their repositories only)."""
    pcs: NotRequired[bool]
    """Nodes AWS PCS launches (a Slurm stack): role and profile under /aws-pcs/, may register with PCS."""
    node_scripts: NotRequired[NodeScriptsSource]
    """A NodeScripts bucket: nodes may read its node-scripts/ prefix (s3:GetObject only), nothing else."""
    eks: NotRequired[bool]
    """Nodes of an EKS stack: the role also joins the cluster, pulls from ECR and runs the VPC CNI."""


class NodeIdentity(pulumi.ComponentResource):
    """The node role, its managed, agent and S3 policies, and the instance profile launch templates use.

    Python users also get `role` (`aws.iam.Role`), `instance_profile` (`aws.iam.InstanceProfile`),
    `agent_policy`, `s3_policy`, `jobs_policy` and `scripts_policy` (`aws.iam.RolePolicy`; `s3_policy`
    None without grants, `jobs_policy` None without a run log group or an ECR image, `scripts_policy`
    None without node_scripts).
    """

    role_name: pulumi.Output[str]
    """The node role's name (attach more policies to it)."""
    role_arn: pulumi.Output[str]
    """The node role's ARN."""
    instance_profile_name: pulumi.Output[str]
    """The instance profile's name."""
    instance_profile_arn: pulumi.Output[str]
    """The instance profile's ARN (what GpuNodeGroupArgs.instance_profile_arn takes)."""

    def __init__(self, name: str, args: NodeIdentityArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        m = validate("NodeIdentity", name, NodeIdentityModel, args, identity_checks)
        super().__init__(type_token("NodeIdentity"), name, None, component_options(opts, OLD_TYPE))
        grants, tags = m.s3_grants, m.tags
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        partition = aws.get_partition_output(opts=invoke).partition
        account = aws.get_caller_identity_output(opts=invoke).account_id
        # AWS PCS takes only a profile whose role is named AWSPCS... or sits under /aws-pcs/ (noderole).
        path = PCS_IAM_PATH if m.pcs else None
        self.role = aws.iam.Role(
            f"{name}-role", assume_role_policy=assume_role_policy(), path=path,
            description="gpucluster GPU nodes: SSM, GPU metrics of their cluster, dataset S3 access",
            permissions_boundary=boundary_arn(partition, account, m.permissions_boundary)
            if m.permissions_boundary else None,
            tags=dict(tags), opts=child)
        for part, policy in {**MANAGED_POLICIES, **(EKS_NODE_POLICIES if m.eks else {})}.items():
            aws.iam.RolePolicyAttachment(
                f"{name}-{part}", role=self.role.name,
                policy_arn=pulumi.Output.concat("arn:", partition, f":iam::aws:policy/{policy}"),
                opts=child)
        self.agent_policy = aws.iam.RolePolicy(
            f"{name}-agent", role=self.role.id,
            policy=json.dumps(agent_policy_document(gpu_metric_namespace(m.cluster_name))), opts=child)
        self.s3_policy: aws.iam.RolePolicy | None = None
        if grants:
            document = pulumi.Output.all(partition, account, *[g.bucket_name for g in grants]).apply(
                lambda values: json.dumps(s3_policy_document(
                    [(bucket, g.prefix, g.write, g.expected_bucket_owner or values[1])
                     for bucket, g in zip(values[2:], grants, strict=True)],
                    partition=values[0])))
            self.s3_policy = aws.iam.RolePolicy(f"{name}-s3", role=self.role.id, policy=document, opts=child)
        self.jobs_policy = self._jobs_policy(name, m.run_log_group, m.container_images, partition, account,
                                             child)
        self.pcs_policy: aws.iam.RolePolicy | None = None
        if m.pcs:
            self.pcs_policy = aws.iam.RolePolicy(
                f"{name}-pcs", role=self.role.id, policy=json.dumps(pcs_register_policy_document()),
                opts=child)
        self.scripts_policy: aws.iam.RolePolicy | None = None
        if m.node_scripts is not None:
            scripts = m.node_scripts
            self.scripts_policy = aws.iam.RolePolicy(
                f"{name}-scripts", role=self.role.id,
                policy=pulumi.Output.all(partition, scripts.bucket_name, scripts.owner).apply(
                    lambda v: json.dumps(scripts_policy_document(v[1], v[2], v[0]))), opts=child)
        self.instance_profile = aws.iam.InstanceProfile(f"{name}-profile", role=self.role.name, path=path,
                                                        tags=dict(tags), opts=child)
        self.role_name = self.role.name
        self.role_arn = self.role.arn
        self.instance_profile_name = self.instance_profile.name
        self.instance_profile_arn = self.instance_profile.arn
        self.register_outputs({"role_name": self.role_name, "role_arn": self.role_arn,
                               "instance_profile_name": self.instance_profile_name,
                               "instance_profile_arn": self.instance_profile_arn})

    def _jobs_policy(self, name: str, log_group: str | None, images: list[str], partition: pulumi.Output[str],
                     account: pulumi.Output[str], child: pulumi.ResourceOptions) -> aws.iam.RolePolicy | None:
        """Job output to the run log group, pulls from the groups' ECR repositories (noderole)."""
        if log_group is None and jobs_policy_document(None, images) is None:
            return None
        region = aws.get_region_output(opts=pulumi.InvokeOutputOptions(parent=self)).region
        document = pulumi.Output.all(partition, region, account).apply(
            lambda v: json.dumps(jobs_policy_document(
                f"arn:{v[0]}:logs:{v[1]}:{v[2]}:log-group:{log_group}" if log_group else None, images)))
        return aws.iam.RolePolicy(f"{name}-jobs", role=self.role.id, policy=document, opts=child)
