"""Component Args: how any component's args are checked, and what only components take.

`validate` checks a component's args with the stack file's own models and named
checks, raising `ArgsError` whose lines read `<Component> <name>: <key path>: <message>`.
The stack file's sections as typed dicts (`NodeGroupSettings`, ...) live in
`aws/settings.py`; here are the types only components take (`NodeScriptsSource`)
and the plumbing every component shares (type tokens, options, owned tags).

It must never hold a rule of its own for a value the stack file also has: those
rules live in `gpucluster.spec`, and what is here only composes them for one
component. Values only components take (subnet, security group and VPC ids,
ASG ARNs) get a format check when they are plain, and pass through when they
are Outputs. No `from __future__ import annotations` here or in the component
modules: the schema analyzer reads these annotations at runtime.
"""

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Annotated, Any, Literal, TypedDict, TypeVar, get_args

import pulumi
from pydantic import AfterValidator, BaseModel, Field, GetPydanticSchema, TypeAdapter, ValidationError

from gpucluster.fleet.tags import CLUSTER_TAG, STACK_TAG
from gpucluster.noderole import ROLE_INLINE_POLICIES_MAX_CHARS, node_inline_policies_chars
from gpucluster.parts import S3Grant
from gpucluster.preflight import CHECKS
from gpucluster.spec import (
    CAPACITY_BLOCK_PLACEMENT,
    IDENTITY_TAG_KEYS,
    AbsolutePath,
    AccountId,
    AutoStopConfig,
    AvailabilityZone,
    BucketName,
    BudgetConfig,
    CapacityConfig,
    ContainerImage,
    DatasetConfig,
    Finding,
    FsxConfig,
    HealthCheckConfig,
    ImageGroupConfig,
    Name,
    NetworkConfig,
    NodeGroupConfig,
    NotificationsConfig,
    ObservabilityConfig,
    PolicyName,
    Region,
    RoleName,
    S3Prefix,
    SpecError,
    SpotConfig,
    StackSpec,
    StrictModel,
    TagValue,
    _matches,
    autostop_findings,
    budget_findings,
    data_path_findings,
    dataset_findings,
    group_zone_findings,
    network_findings,
    node_group_findings,
    single_zone_findings,
    tag_key,
    unique_name_findings,
    validation_findings,
    zone_region_findings,
)

# ----------------------------------------------------------- what only components take


class NodeScriptsSource(TypedDict):
    """Where nodes fetch the node scripts bundle: a NodeScripts component's bucket and its account."""

    bucket_name: pulumi.Input[str]
    """The bucket holding node-scripts/<sha256>.tar (NodeScripts.bucket_name)."""
    owner: pulumi.Input[str]
    """The 12-digit account owning it (NodeScripts.bucket_owner): nodes read it only from that account."""


# ----------------------------------------------------------------------- component plumbing

PACKAGE = "gpucluster"


def type_token(component: str) -> str:
    """`gpucluster:index:<Type>`: the token Pulumi's component packages use (one module, index)."""
    return f"{PACKAGE}:index:{component}"


def component_options(opts: pulumi.ResourceOptions | None, old_type: str) -> pulumi.ResourceOptions:
    """`opts` plus an alias from the type token a component had before (`gpucluster:<module>:<Type>`).

    Without it, a new type token is a new URN for the component and every resource under it, and
    `pulumi up` would replace them all (protected buckets block that). Children need no alias of
    their own: the engine re-parents a child's URN under the old URN its parent matched
    (pulumi/pulumi pkg/resource/deploy/step_generator.go, `generateAliases`), level by level.
    """
    return pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(aliases=[pulumi.Alias(type_=old_type)]))


def owned_tags(tags: Mapping[str, str], identity: str, cluster_name: str) -> dict[str, str]:
    """`tags` plus the identity tags a component sets itself (they win over the caller's)."""
    return {**tags, STACK_TAG: identity, CLUSTER_TAG: cluster_name}


# ------------------------------------------------------------------------- checking


class ArgsError(SpecError, pulumi.RunError):
    """Invalid component args: every problem, one line each, `<Component> <name>: <key path>: <message>`.

    A `pulumi.RunError` too: under `pulumi up` a user's program stops with these lines and
    no Python traceback (Pulumi's Python runtime prints a RunError's message only).
    """

    def __init__(self, component: str, name: str, findings: list[Finding]) -> None:
        super().__init__(findings)
        self.component, self.resource_name = component, name
        self.args = ("\n".join(f"{component} {name}: {f}" for f in findings),)


def field_rule(model: type[BaseModel], field: str) -> Any:
    """The type of one field of a stack-file model with all its validators (to check a value alone)."""
    info = model.model_fields[field]
    return Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation


def is_plain(value: Any) -> bool:
    """False for an Output or other awaitable: its value is only known at deploy time."""
    return not isinstance(value, pulumi.Output) and not inspect.isawaitable(value)


def input_rule(rule: Any) -> AfterValidator:
    """What checks a `pulumi.Input` field, `Annotated[Any, input_rule(<type>)]`: `rule` when the value
    is plain, nothing when it is an Output (its value is only known at deploy time)."""
    adapter: TypeAdapter[Any] = TypeAdapter(rule)

    def check(value: Any) -> Any:
        if not is_plain(value):
            return value
        try:
            return adapter.validate_python(value)
        except ValidationError as exc:
            raise ValueError(validation_findings(exc)[0].message) from None

    return AfterValidator(check)


def rule_of(model: type[BaseModel], field: str) -> GetPydanticSchema:
    """What checks a field as one stack-file field, `Annotated[Any, rule_of(<Model>, <field>)]`: that
    field's type and validators (`field_rule`), spelt so a type checker reads the annotation."""
    rule = field_rule(model, field)
    return GetPydanticSchema(lambda _source, handler: handler.generate_schema(rule))


M = TypeVar("M", bound=BaseModel)


def validate(component: str, name: str, model: type[M], args: Any,
             *checks: Callable[[M], Iterable[Finding]]) -> M:
    """`args` checked by `model` and then `checks`, or ArgsError listing every problem.

    Called first thing in a component's `__init__`, so bad args declare no resource at all.
    """
    if not isinstance(args, Mapping):
        raise ArgsError(component, name, [Finding("args", f"must be a mapping of keys, got "
                                                          f"{type(args).__name__}")])
    try:
        value = model.model_validate(dict(args))
    except ValidationError as exc:
        raise ArgsError(component, name, validation_findings(exc, model)) from None
    findings = [f for check in checks for f in check(value) if f.level == "error"]
    if findings:
        raise ArgsError(component, name, findings)
    return value


# Tags take the stack file's rule for extra tags (keys not under aws: or gpucluster:, values 1-256
# safe characters), except that the two identity tags pass: components that take no `identity`
# (network, datasets, node IAM) receive them this way from GpuCluster; those that take one
# (GpuNodeGroup, Guardrails) set their own over them (`owned_tags`).
Tags = dict[Annotated[str, tag_key(IDENTITY_TAG_KEYS)], TagValue]
SubnetId = get_args(field_rule(NetworkConfig, "existing_subnets"))[1]
VpcId = field_rule(NetworkConfig, "existing_vpc_id")
# Values only components take (the stack file names none of them): format checks, nothing more.
SecurityGroupId = Annotated[str, _matches(r"sg-[0-9a-f]{8,17}",
                                          "must be a security group id like sg-0abc12345def67890")]
AsgName = Annotated[str, _matches(r"[^:]{1,255}", "must be an Auto Scaling group name (1-255 "
                                                  "characters, no ':')")]
AsgArn = Annotated[str, _matches(
    r"arn:aws[a-z-]*:autoscaling:[a-z0-9-]+:\d{12}:autoScalingGroup:[^:]+:autoScalingGroupName/[^:]{1,255}",
    "must be an Auto Scaling group ARN (arn:aws:autoscaling:<region>:<account>:autoScalingGroup:"
    "<id>:autoScalingGroupName/<name>)")]
Arn = Annotated[str, _matches(r"arn:aws[a-z-]*:[a-z0-9-]+:[^\s]*", "must be an ARN (arn:aws:...)")]
# CloudWatch Logs API reference, CreateLogGroup: 1-512 characters of a-z, A-Z, 0-9, '_-/.#'.
LogGroupName = Annotated[str, _matches(r"[A-Za-z0-9_./#-]{1,512}", "must be a log group name (1-512 "
                                       "characters of letters, digits and _-/.#)")]
NonEmpty = Annotated[str, _matches(r"\S.*", "must be a non-empty string")]
Identity = TagValue
"""The `gpucluster:stack` tag value: what every guardrail and CLI operation selects resources by."""


class GroupNetworkModel(StrictModel):
    """What the network must provide one node group (ClusterNetworkArgs.node_groups)."""

    name: Name
    availability_zones: Annotated[list[AvailabilityZone], Field(min_length=1)]
    efa: bool = False
    multi_node: bool = False
    placement_group: bool = False


class DataMountModel(StrictModel):
    """One dataset as the node bootstrap brings it (GpuNodeGroupArgs.data_mounts)."""

    name: Name
    access: Annotated[Any, rule_of(DatasetConfig, "access")]
    bucket_name: Annotated[Any, input_rule(BucketName)]
    prefix: S3Prefix = ""
    path: AbsolutePath
    fsx_dns_name: Any = None
    fsx_mount_name: Any = None
    fsx_client_key_fingerprints: Annotated[Any, rule_of(FsxConfig, "client_key_fingerprints")] = Field(
        default_factory=list)
    expected_bucket_owner: Annotated[Any, input_rule(AccountId | None)] = None


class BucketGrantModel(StrictModel):
    """Node access to one bucket (NodeIdentityArgs.s3_grants)."""

    bucket_name: Annotated[Any, input_rule(BucketName)]
    prefix: S3Prefix = ""
    write: bool = False
    expected_bucket_owner: AccountId | None = None


class ClusterNetworkModel(StrictModel):
    """ClusterNetworkArgs, checked: the stack file's network rules plus each group's network needs."""

    cluster_name: Name
    region: Region
    availability_zones: Annotated[Any, rule_of(NetworkConfig, "availability_zones")]
    vpc_cidr: Annotated[Any, rule_of(NetworkConfig, "vpc_cidr")] = None
    nat_gateway: bool = True
    existing_vpc_id: Annotated[Any, input_rule(VpcId)] = None
    existing_subnet_ids: dict[AvailabilityZone, Annotated[Any, input_rule(SubnetId)]] = Field(
        default_factory=dict)
    tags: Tags = Field(default_factory=dict)
    node_groups: list[GroupNetworkModel] = Field(default_factory=list)
    flow_logs: Annotated[Any, rule_of(NetworkConfig, "flow_logs")] = "reject"
    permissions_boundary: PolicyName | None = None
    remote_write: bool = False
    slurm: bool = False
    eks: bool = False


def network_checks(m: ClusterNetworkModel) -> Iterable[Finding]:
    yield from zone_region_findings(m.availability_zones, m.region, "availability_zones", "region")
    net = NetworkConfig.model_construct(availability_zones=m.availability_zones, vpc_cidr=m.vpc_cidr,
                                        existing_vpc_id=m.existing_vpc_id,
                                        existing_subnets=m.existing_subnet_ids)
    yield from network_findings(net, path="", subnets_key="existing_subnet_ids")
    yield from unique_name_findings([g.name for g in m.node_groups], "node_groups", "node group")
    for i, g in enumerate(m.node_groups):
        yield from group_zone_findings(g.availability_zones, m.availability_zones, f"node_groups[{i}]",
                                       network_key="availability_zones")
        yield from single_zone_findings(g.efa, g.placement_group, g.availability_zones, f"node_groups[{i}]")


class NodeScriptsSourceModel(StrictModel):
    """Where nodes fetch the node scripts bundle (GpuNodeGroupArgs / NodeIdentityArgs.node_scripts)."""

    bucket_name: Annotated[Any, input_rule(BucketName)]
    owner: Annotated[Any, input_rule(AccountId)]


class EksNodeModel(StrictModel):
    """GpuNodeGroupArgs.eks: the cluster the nodes join (values from EksCluster, Outputs pass through)."""

    cluster_name: Annotated[str, _matches(r"[0-9A-Za-z][A-Za-z0-9_-]{0,99}", "must be an EKS cluster name")]
    endpoint: Annotated[Any, input_rule(NonEmpty)]
    certificate_authority: Annotated[Any, input_rule(NonEmpty)]
    service_cidr: Annotated[Any, input_rule(NonEmpty)]
    kubernetes_version: Annotated[str, _matches(r"1\.[0-9]{2}", "must be a Kubernetes version like 1.33")]
    mig_strategy: Literal["single", "mixed"] | None = None


class GpuNodeGroupModel(StrictModel):
    """GpuNodeGroupArgs, checked: the node group as the stack file checks it, plus where it runs."""

    node_group: NodeGroupConfig
    cluster_name: Name
    region: Region
    identity: Identity
    subnet_ids: Annotated[Any, input_rule(
        Annotated[list[Annotated[Any, input_rule(SubnetId)]], Field(min_length=1)])]
    security_group_ids: Annotated[Any, input_rule(
        Annotated[list[Annotated[Any, input_rule(SecurityGroupId)]], Field(min_length=1, max_length=5)])]
    placement_group_name: Annotated[Any, input_rule(NonEmpty | None)] = None
    instance_profile_arn: Annotated[Any, input_rule(Arn)]
    tags: Tags = Field(default_factory=dict)
    spot: SpotConfig = SpotConfig()
    data_mounts: list[DataMountModel] = Field(default_factory=list)
    autostop: AutoStopConfig | None = None
    node_role_name: Annotated[Any, input_rule(NonEmpty | None)] = None
    notify_topic_arn: Annotated[Any, input_rule(Annotated[str, _matches(
        r"(arn:aws[a-z-]*:sns:[^\s]+)?", "must be an SNS topic ARN or empty")])] = ""
    notify_key_arn: Annotated[Any, input_rule(Annotated[str, _matches(
        r"(arn:aws[a-z-]*:kms:[^\s]+)?", "must be a KMS key ARN or empty")])] = ""
    observability: ObservabilityConfig = ObservabilityConfig()
    remote_write_url: Annotated[Any, input_rule(str)] = ""
    image: ImageGroupConfig | None = None
    scheduler: Literal["none", "slurm", "eks"] = "none"
    slurm_ami_id: Annotated[Any, rule_of(NodeGroupConfig, "ami_id")] = None
    node_scripts: NodeScriptsSourceModel | None = None
    eks: EksNodeModel | None = None


def node_group_checks(m: GpuNodeGroupModel) -> Iterable[Finding]:
    """Every per-group rule of the stack file; zones counted from the subnets when not listed."""
    g = m.node_group
    if g.availability_zones:
        yield from node_group_findings(g, g.availability_zones, "node_group")
    else:
        subnets = m.subnet_ids if is_plain(m.subnet_ids) else None
        for f in node_group_findings(g, subnets, "node_group"):
            yield replace(f, path="subnet_ids") if f.path == "node_group.availability_zones" else f
    if g.capacity.market == "capacity_block" and m.placement_group_name is not None:
        yield Finding("placement_group_name", f"{CAPACITY_BLOCK_PLACEMENT}; leave it out")
    yield from unique_name_findings([d.name for d in m.data_mounts], "data_mounts", "data mount")
    placed: dict[str, str] = {}
    for i, d in enumerate(m.data_mounts):
        if d.access == "fsx" and (d.fsx_dns_name is None or d.fsx_mount_name is None):
            yield Finding(f"data_mounts[{i}]", "access fsx needs fsx_dns_name and fsx_mount_name")
        if d.access != "copy_to_scratch":
            yield from data_path_findings(d.path, f"data_mounts[{i}].path", [g.scratch_mount], placed)
            placed[d.name] = d.path
    if (m.scheduler == "eks") != (m.eks is not None):
        yield Finding("eks", "required with scheduler eks, and only then (the cluster the nodes join)")
    if g.health_checks.enabled and m.node_role_name is None:
        yield Finding("node_role_name", "required while node_group.health_checks.enabled: the nodes' role "
                      "must be allowed to answer the launch check (or set health_checks.enabled: false)")


class NodeIdentityModel(StrictModel):
    """NodeIdentityArgs, checked."""

    cluster_name: Name
    s3_grants: list[BucketGrantModel] = Field(default_factory=list)
    tags: Tags = Field(default_factory=dict)
    permissions_boundary: PolicyName | None = None
    run_log_group: LogGroupName | None = None
    container_images: list[ContainerImage] = Field(default_factory=list)
    pcs: bool = False
    node_scripts: NodeScriptsSourceModel | None = None
    eks: bool = False


def identity_checks(m: NodeIdentityModel) -> Iterable[Finding]:
    for i, grant in enumerate(m.s3_grants):
        if grant.write and not grant.prefix:
            # The stack file's checkpoint_prefix rule: writes go under a prefix, never the whole bucket.
            yield Finding(f"s3_grants[{i}].prefix", "must be a folder-like prefix such as "
                          "'checkpoints/', not the whole bucket (nodes get write access to it)")
    grants = [S3Grant(g.bucket_name, g.prefix, g.write, g.expected_bucket_owner) for g in m.s3_grants]
    chars = node_inline_policies_chars(m.cluster_name, grants, run_log_group=m.run_log_group,
                                       images=m.container_images, node_scripts=m.node_scripts is not None)
    if chars > ROLE_INLINE_POLICIES_MAX_CHARS:  # the stack file's node_role_size rule, for grants
        yield Finding("s3_grants", f"the node role's policies for {len(grants)} grant(s) would reach "
                      f"{chars} characters; IAM allows {ROLE_INLINE_POLICIES_MAX_CHARS} per role")


class NodeScriptsModel(StrictModel):
    """NodeScriptsArgs, checked."""

    cluster_name: Name
    identity: Identity
    region: Region
    tags: Tags = Field(default_factory=dict)
    break_glass_role: RoleName | None = None


class DatasetBucketModel(StrictModel):
    """DatasetBucketArgs, checked: the dataset as the stack file checks it."""

    dataset: DatasetConfig
    cluster_name: Name
    region: Region
    tags: Tags = Field(default_factory=dict)
    break_glass_role: RoleName | None = None


def bucket_checks(m: DatasetBucketModel) -> Iterable[Finding]:
    yield from dataset_findings(m.dataset, m.cluster_name, None, "dataset")


class LustreFileSystemModel(StrictModel):
    """LustreFileSystemArgs, checked: the dataset (with its fsx settings) as the stack file checks it."""

    dataset: DatasetConfig
    bucket_name: Annotated[Any, input_rule(BucketName)]
    vpc_id: Annotated[Any, input_rule(VpcId)]
    subnet_id: Annotated[Any, input_rule(SubnetId)]
    node_security_group_ids: dict[Name, Annotated[Any, input_rule(SecurityGroupId)]] = Field(
        default_factory=dict)
    tags: Tags = Field(default_factory=dict)


def lustre_checks(m: LustreFileSystemModel) -> Iterable[Finding]:
    d = m.dataset
    if d.fsx is None and d.access != "fsx":
        yield Finding("dataset.fsx", "required: the file system's settings (with access: fsx)")
    # The bucket is named by bucket_name here, so the bucket-naming rules do not apply.
    yield from (f for f in dataset_findings(d, "", None, "dataset") if f.path != "dataset.bucket_name")


class GuardedGroupModel(StrictModel):
    """One Auto Scaling group the guardrails act on (GuardrailsArgs.groups)."""

    name: Name
    asg_name: Annotated[Any, input_rule(AsgName)]
    asg_arn: Annotated[Any, input_rule(AsgArn)]
    can_run_spot: bool
    capacity_block_reservation_id: Annotated[Any, rule_of(CapacityConfig, "capacity_reservation_id")] = None


class GuardrailsModel(StrictModel):
    """GuardrailsArgs, checked: budget, autostop and spot as the stack file checks them."""

    groups: Annotated[list[GuardedGroupModel], Field(min_length=1, max_length=20)]
    cluster_name: Name
    identity: Identity
    region: Region
    tags: Tags = Field(default_factory=dict)
    budget: BudgetConfig | None = None
    autostop: AutoStopConfig = AutoStopConfig(enabled=False)
    spot: SpotConfig = SpotConfig()
    tag_groups: bool = False
    permissions_boundary: PolicyName | None = None
    spend_prices: dict[str, Any] | None = None
    restart_jobs: bool = False
    notify_emails: Annotated[Any, rule_of(NotificationsConfig, "emails")] = Field(default_factory=list)


def guardrails_checks(m: GuardrailsModel) -> Iterable[Finding]:
    yield from unique_name_findings([g.name for g in m.groups], "groups", "group")
    if m.budget is not None:
        yield from budget_findings(m.budget)
    yield from autostop_findings(m.autostop)


class DashboardGroupModel(StrictModel):
    """One node group on the dashboard (ClusterDashboardArgs.groups)."""

    name: Name
    asg_name: Annotated[Any, input_rule(AsgName)]
    stuck_alarm_minutes: Annotated[Any, rule_of(HealthCheckConfig, "stuck_alarm_minutes")] = None
    mig: bool = False


class ClusterDashboardModel(StrictModel):
    """ClusterDashboardArgs, checked."""

    cluster_name: Name
    identity: Identity
    region: Region
    groups: Annotated[list[DashboardGroupModel], Field(min_length=1, max_length=20)]
    notify_topic_arn: Annotated[Any, input_rule(Arn | None)] = None
    guardrail_log_groups: list[Annotated[Any, input_rule(NonEmpty)]] = Field(default_factory=list)
    alarm_arns: list[Annotated[Any, input_rule(Arn)]] = Field(default_factory=list)
    budget: BudgetConfig | None = None
    tags: Tags = Field(default_factory=dict)


def dashboard_checks(m: ClusterDashboardModel) -> Iterable[Finding]:
    yield from unique_name_findings([g.name for g in m.groups], "groups", "group")
    for i, g in enumerate(m.groups):
        if g.stuck_alarm_minutes is not None and m.notify_topic_arn is None:
            yield Finding(f"groups[{i}].stuck_alarm_minutes",
                          "needs notify_topic_arn: the alarm only notifies")


def stack_checks(spec: StackSpec) -> Iterable[Finding]:
    """GpuClusterArgs: every named check of the stack file (the preflight's included), in its order."""
    for rule in CHECKS:
        yield from rule(spec)
