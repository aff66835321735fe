"""NodeImages: the EC2 Image Builder pipelines that bake each node group's image once.

It owns the build side of `gpucluster:images`: per baked group a component (the document of
`gpucluster.node.bake`: installs once what the launch path would otherwise install at every boot),
an image recipe on the group's base (the Deep Learning AMI its SSM parameter names, resolved once at
creation and then kept, as a node group's AMI is; or the group's own ami_id), a distribution setting
(the AMI named and tagged with the stack's identity) and a pipeline run on demand (`gpucluster image
build`) and, with `schedule`, on a cron. Shared by the groups: the build instance's role (Image
Builder's and SSM's managed policies, plus tagging only this stack's images with the three test tags,
and ECR pulls of the groups' own repositories), its instance profile, a security group with no
ingress and HTTPS/HTTP egress only, and the infrastructure configuration in the stack's private
subnet (no public address: a private subnet maps none) with IMDSv2 required. It never changes a node
group: a group moves to a new image only when its `images.groups.<group>.ami_id` is changed.
"""

from __future__ import annotations

import json
from typing import Any, NotRequired, TypedDict

import pulumi
import pulumi_aws as aws

from gpucluster.aws.amis import root_device
from gpucluster.aws.args import type_token
from gpucluster.aws.iam import assume_role_policy, boundary_arn
from gpucluster.fleet.tags import STACK_TAG
from gpucluster.node.bake import IMAGE_TAGS, BakeSettings, component_document, recipe_name
from gpucluster.noderole import ECR_PULL_ACTIONS, ecr_repository

# EC2 Image Builder user guide, "Set up IAM roles for Image Builder": the build and test instances'
# profile needs EC2InstanceProfileForImageBuilder and AmazonSSMManagedInstanceCore (SSM runs AWSTOE).
BUILD_MANAGED_POLICIES = {"imagebuilder": "EC2InstanceProfileForImageBuilder",
                          "ssm": "AmazonSSMManagedInstanceCore"}
IMDS_HOP_LIMIT = 2  # as the nodes': containers (the pre-pull) reach IMDSv2
BUILD_TIMEOUT_MINUTES = 120  # the image tests' timeout (Image Builder allows 60-1440)
# No supportedOsVersions on the component: it is optional in CreateComponent, and "a prefix match is
# performed against the base image OS version during image recipe creation" (botocore imagebuilder
# model) against names we cannot check here, so a wrong one would fail the recipe at deploy. The
# component's first step refuses an OS it cannot install on (gpucluster-os), before installing anything.


def build_policy_document(identity: str, region: str, partition: str, images: list[str]) -> dict[str, Any]:
    """What the build instance may do beyond the managed policies: tag the images of this stack (the
    distribution tags them with its identity) with the test's three tags only, and pull the groups'
    own ECR repositories."""
    statements: list[dict[str, Any]] = [{
        "Sid": "RecordTestResults", "Effect": "Allow", "Action": ["ec2:CreateTags"],
        "Resource": [f"arn:{partition}:ec2:{region}::image/*"],
        "Condition": {"StringEquals": {f"aws:ResourceTag/{STACK_TAG}": identity},
                      "ForAllValues:StringEquals": {"aws:TagKeys": list(IMAGE_TAGS)}}}]
    repositories = sorted({r.arn for image in images if (r := ecr_repository(image))})
    if repositories:
        statements += [
            {"Sid": "EcrLogin", "Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"], "Resource": "*"},
            {"Sid": "EcrPull", "Effect": "Allow", "Action": ECR_PULL_ACTIONS, "Resource": repositories}]
    return {"Version": "2012-10-17", "Statement": statements}


class ImageGroupArgs(TypedDict):
    """One baked node group as its recipe needs it."""

    name: str
    """The node group."""
    parent_image: pulumi.Input[str]
    """The base AMI id (resolved), or an SSM parameter path read once at creation."""
    root_volume_size_gib: int
    """The image's root volume (the group's: the container image must fit)."""
    container_image: NotRequired[str]
    """Pre-pulled into the image."""
    fsx: NotRequired[bool]
    """Bake the Lustre client (an FSx dataset)."""
    mount_s3: NotRequired[bool]
    """Bake Mountpoint for S3 (a mounted dataset)."""
    efa: NotRequired[bool]
    """Check the EFA software is in the base."""
    lustre_key_fingerprints: NotRequired[list[str]]
    """Pinned keys of AWS's Lustre client repository."""
    slurm_version: NotRequired[str]
    """A Slurm stack's Slurm version: bake the AWS PCS agent and Slurm installers (absent: neither)."""


class NodeImagesArgs(TypedDict):
    """The stack's baked groups and where their images are built."""

    cluster_name: str
    """The cluster (names and descriptions)."""
    identity: str
    """The gpucluster:stack tag value: on every resource and on every image built."""
    region: str
    """The region the images are built and kept in."""
    vpc_id: pulumi.Input[str]
    """The stack's VPC (the build security group)."""
    subnet_id: pulumi.Input[str]
    """A private subnet of the stack: builds get no public address."""
    groups: list[ImageGroupArgs]
    """The baked groups."""
    version: NotRequired[str]
    """The recipes' semantic version (default 1.0.0)."""
    build_instance_type: NotRequired[str]
    """The GPU instance type that builds and tests (default g6.xlarge)."""
    build_gpus: NotRequired[int]
    """Its GPU count (the test fails below it)."""
    schedule: NotRequired[str]
    """A cron expression: also build on it (default: on demand only)."""
    schedule_timezone: NotRequired[str]
    """The schedule's timezone (default UTC)."""
    tags: NotRequired[dict[str, str]]
    """Tags of every resource and image."""
    permissions_boundary: NotRequired[str]
    """The boundary policy name of the build role."""


class NodeImages(pulumi.ComponentResource):
    """Image Builder pipelines, one per baked node group, and the build infrastructure they share.

    Python users also get `role`, `instance_profile`, `security_group`, `infrastructure`, and per
    group `components`, `recipes`, `distributions`, `pipelines` (dicts by group name).
    """

    pipeline_arns: pulumi.Output[dict[str, str]]
    """Node group -> its image pipeline (what `gpucluster image build` starts)."""
    recipe_arns: pulumi.Output[dict[str, str]]
    """Node group -> its image recipe."""

    def __init__(self, name: str, args: NodeImagesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(type_token("NodeImages"), name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        tags = dict(args.get("tags", {}))
        identity, region, cluster = args["identity"], args["region"], args["cluster_name"]
        partition = aws.get_partition_output(opts=invoke).partition
        account = aws.get_caller_identity_output(opts=invoke).account_id
        boundary = args.get("permissions_boundary")
        self.role = aws.iam.Role(
            f"{name}-build-role", assume_role_policy=assume_role_policy(),
            description="gpucluster image builds: Image Builder and SSM, tag this stack's images",
            permissions_boundary=boundary_arn(partition, account, boundary) if boundary else None,
            tags=tags, opts=child)
        for part, policy in BUILD_MANAGED_POLICIES.items():
            aws.iam.RolePolicyAttachment(
                f"{name}-build-{part}", role=self.role.name,
                policy_arn=pulumi.Output.concat("arn:", partition, f":iam::aws:policy/{policy}"),
                opts=child)
        images = [g["container_image"] for g in args["groups"] if g.get("container_image")]
        aws.iam.RolePolicy(f"{name}-build", role=self.role.id, policy=partition.apply(
            lambda p: json.dumps(build_policy_document(identity, region, p, images))), opts=child)
        self.instance_profile = aws.iam.InstanceProfile(f"{name}-build-profile", role=self.role.name,
                                                        tags=tags, opts=child)
        # No ingress (SSM is reached outbound); egress to HTTPS (AWS APIs, ECR, S3, the registries)
        # and HTTP (apt mirrors, which apt checks by signature) only.
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-build-sg", vpc_id=args["vpc_id"], description="gpucluster image builds: egress only",
            egress=[{"protocol": "tcp", "from_port": port, "to_port": port, "cidr_blocks": ["0.0.0.0/0"],
                     "description": what} for port, what in ((443, "HTTPS"), (80, "apt over HTTP"))],
            tags=tags, opts=child)
        self.infrastructure = aws.imagebuilder.InfrastructureConfiguration(
            f"{name}-infra", name=recipe_name(cluster, identity, "build"),
            description=f"gpucluster {cluster}: GPU image builds in the stack's private subnet",
            instance_profile_name=self.instance_profile.name,
            instance_types=[args.get("build_instance_type", "g6.xlarge")],
            subnet_id=args["subnet_id"], security_group_ids=[self.security_group.id],
            instance_metadata_options={"http_tokens": "required",
                                       "http_put_response_hop_limit": IMDS_HOP_LIMIT},
            terminate_instance_on_failure=True, resource_tags=tags, tags=tags, opts=child)
        self.components: dict[str, aws.imagebuilder.Component] = {}
        self.recipes: dict[str, aws.imagebuilder.ImageRecipe] = {}
        self.distributions: dict[str, aws.imagebuilder.DistributionConfiguration] = {}
        self.pipelines: dict[str, aws.imagebuilder.ImagePipeline] = {}
        version = args.get("version", "1.0.0")
        for g in args["groups"]:
            self._group(name, g, args, version, tags, child)
        self.pipeline_arns = pulumi.Output.all(
            **{n: p.arn for n, p in self.pipelines.items()}).apply(dict) if self.pipelines else \
            pulumi.Output.from_input({})
        self.recipe_arns = pulumi.Output.all(
            **{n: r.arn for n, r in self.recipes.items()}).apply(dict) if self.recipes else \
            pulumi.Output.from_input({})
        self.register_outputs({"pipeline_arns": self.pipeline_arns, "recipe_arns": self.recipe_arns})

    def _group(self, name: str, g: ImageGroupArgs, args: NodeImagesArgs, version: str,
               tags: dict[str, str], child: pulumi.ResourceOptions) -> None:
        invoke = pulumi.InvokeOptions(parent=self)
        group, cluster, identity = g["name"], args["cluster_name"], args["identity"]
        base = recipe_name(cluster, identity, group)
        document = component_document(BakeSettings(
            node_group=group, region=args["region"], container_image=g.get("container_image"),
            fsx=g.get("fsx", False), mount_s3=g.get("mount_s3", False), efa=g.get("efa", False),
            build_gpus=args.get("build_gpus", 1),
            lustre_key_fingerprints=tuple(g.get("lustre_key_fingerprints", [])),
            slurm_version=g.get("slurm_version")))
        component = self.components[group] = aws.imagebuilder.Component(
            f"{name}-{group}-component", name=base, platform="Linux", version=version, data=document,
            description=f"gpucluster {cluster}/{group}: node software installed once",
            tags=tags, opts=child)
        # The ignore: pulumi-aws types the EBS flags as strings; the booleans reach the engine as written.
        recipe = self.recipes[group] = aws.imagebuilder.ImageRecipe(  # type: ignore[call-overload]
            f"{name}-{group}-recipe", name=base, version=version, parent_image=g["parent_image"],
            components=[{"component_arn": component.arn}],
            # The base's own root device (/dev/sda1 on Ubuntu, /dev/xvda on Amazon Linux): `aws.amis`.
            block_device_mappings=[{"device_name": root_device(g["parent_image"], invoke), "ebs": {
                "volume_size": g["root_volume_size_gib"], "volume_type": "gp3", "encrypted": True,
                "delete_on_termination": True}}],
            systems_manager_agent={"uninstall_after_build": False},  # nodes are managed through SSM
            description=f"gpucluster {cluster}/{group}", tags=tags,
            # The base is resolved once (a Deep Learning AMI parameter moves with every release): the
            # recipe, like the group's launch template, changes only when the version is raised.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["parentImage"]))
        distribution = self.distributions[group] = aws.imagebuilder.DistributionConfiguration(
            f"{name}-{group}-distribution", name=base,
            distributions=[{"region": args["region"], "ami_distribution_configuration": {
                "name": f"{base}-{{{{ imagebuilder:buildDate }}}}",
                "description": f"gpucluster {cluster}/{group} baked node image",
                "ami_tags": {**tags, "gpucluster:node-group": group}}}],
            tags=tags, opts=child)
        schedule: aws.imagebuilder.ImagePipelineScheduleArgsDict | None = (
            {"schedule_expression": args["schedule"], "timezone": args.get("schedule_timezone", "UTC"),
             "pipeline_execution_start_condition": "EXPRESSION_MATCH_ONLY"}
            if args.get("schedule") else None)
        self.pipelines[group] = aws.imagebuilder.ImagePipeline(
            f"{name}-{group}-pipeline", name=base, image_recipe_arn=recipe.arn,
            infrastructure_configuration_arn=self.infrastructure.arn,
            distribution_configuration_arn=distribution.arn,
            image_tests_configuration={"image_tests_enabled": True, "timeout_minutes": BUILD_TIMEOUT_MINUTES},
            status="ENABLED", description=f"gpucluster {cluster}/{group}: run by `gpucluster image build`",
            schedule=schedule, tags=tags, opts=child)
