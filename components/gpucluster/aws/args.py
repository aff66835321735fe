"""Component Args: the stack file's sections as typed dicts, and how any component's args are checked.

It owns two things. The settings types (`NodeGroupSettings`, `BudgetSettings`, ...)
spell each stack-file section as a `TypedDict`, key for key and with the same
docstrings as the pydantic models of `gpucluster.spec`, so a component takes a
node group or a budget exactly as a stack file writes it (and Pulumi's schema
analyzer turns them into package types). And `validate` checks a component's
args with the stack file's own models and named checks, raising `ArgsError`
whose lines read `<Component> <name>: <key path>: <message>`.

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
from typing import Annotated, Any, Literal, NotRequired, TypedDict, TypeVar, get_args

import pulumi
from pydantic import AfterValidator, BaseModel, Field, TypeAdapter, ValidationError

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
    ClusterConfig,
    ContainerImage,
    DatasetConfig,
    Finding,
    FsxConfig,
    GrafanaConfig,
    HealthCheckConfig,
    ImageGroupConfig,
    ImagesConfig,
    Name,
    NetworkConfig,
    NodeGroupConfig,
    NotificationsConfig,
    ObservabilityConfig,
    PolicyName,
    PrometheusConfig,
    Region,
    RoleName,
    S3Prefix,
    SchedulerConfig,
    SlurmLoginConfig,
    SpecError,
    SpotConfig,
    StackSpec,
    StrictModel,
    TagValue,
    WarmPoolConfig,
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

# ------------------------------------------------------------------ the stack file's sections


class CostTagSettings(TypedDict):
    """The cost tags every resource carries (activate them as cost-allocation tags to see costs by them)."""

    owner: str
    """Team or person accountable for the cluster (tag `owner`)."""
    cost_center: str
    """Cost centre for your bills (tag `cost_center`; the budget filters on `gpucluster:stack`)."""
    environment: str
    """`prod` gets the production policies; anything else is non-prod."""


class ClusterSettings(TypedDict):
    """The stack file's `cluster` section: name and tags."""

    name: str
    """Short name used in every resource name; the stack name is added to tags."""
    tags: CostTagSettings
    """Required cost tags: owner, cost_center, environment."""
    extra_tags: NotRequired[dict[str, str]]
    """More tags for every resource (team, project, ...); keys under aws: and gpucluster: are reserved."""
    permissions_boundary: NotRequired[str]
    """Policy name: the permissions boundary of every IAM role the stack creates (none by default)."""
    break_glass_role: NotRequired[str]
    """The only role that may delete versions in, or delete, the dataset buckets the stack creates."""


class NetworkSettings(TypedDict):
    """The stack file's `network` section: a new VPC or an existing one, and the zones."""

    availability_zones: list[str]
    """Zones the cluster may use; EFA groups use exactly one of them."""
    vpc_cidr: NotRequired[str]
    """Create a VPC with this CIDR (private subnets, NAT, S3/SSM endpoints)."""
    nat_gateway: NotRequired[bool]
    """Internet egress for nodes through one NAT gateway (created VPCs only)."""
    existing_vpc_id: NotRequired[str]
    """Use this VPC instead of creating one."""
    existing_subnets: NotRequired[dict[str, str]]
    """With existing_vpc_id: the private subnet to use in each availability zone."""
    flow_logs: NotRequired[str]
    """VPC flow logs to a KMS-encrypted CloudWatch log group (90 days): rejected traffic, all, or off."""


class CapacitySettings(TypedDict):
    """A node group's `capacity`: the on-demand / spot / reservation mix."""

    market: NotRequired[str]
    """`mixed`: on-demand base + spot above it; `capacity_block`: a purchased Capacity Block."""
    on_demand_base: NotRequired[int]
    """Nodes always bought on-demand (or from a reservation) before any spot."""
    spot_percent: NotRequired[float]
    """Share of nodes above the base that are spot, 0..100."""
    spot_allocation_strategy: NotRequired[str]
    """How the ASG picks spot pools (AWS Auto Scaling allocation strategies)."""
    on_demand_allocation_strategy: NotRequired[str]
    """`prioritized` follows instance_types order for on-demand nodes."""
    base_commitment: NotRequired[str]
    """How the on-demand base is paid for; used by the cost model."""
    capacity_reservation_id: NotRequired[str]
    """Targeted on-demand capacity reservation, or the Capacity Block's reservation id."""
    duration_hours: NotRequired[int]
    """capacity_block only: the block's length in hours; the cost model prices the block for it."""
    instance_count: NotRequired[int]
    """capacity_block only: the instances the block holds; max_nodes may not exceed it (Slurm: required)."""


class NodeFileSettings(TypedDict):
    """One of a node group's `files`: written on every node at boot."""

    path: str
    """Where the file goes on every node of the group, e.g. /opt/gpucluster/hooks/drain.sh."""
    content: NotRequired[str]
    """The file's text, written as is."""
    source: NotRequired[str]
    """Instead of content: a file of the project (relative to the directory holding Pulumi.yaml)."""
    mode: NotRequired[str]
    """Permissions, e.g. 0755 for a script a hook command runs."""


class HealthCheckSettings(TypedDict):
    """A node group's `health_checks`: GPU checks at launch and while running, and their outcome."""

    enabled: NotRequired[bool]
    """Check every node before it joins (launch lifecycle hook) and every interval_minutes after."""
    interval_minutes: NotRequired[int]
    """How often a running node checks itself."""
    launch_timeout_minutes: NotRequired[int]
    """A new node that has not answered the launch check by then is abandoned; default 15, 40 with mig."""
    xid_window_minutes: NotRequired[int]
    """A running node counts XID errors of the last this many minutes (at launch: since boot)."""
    ignored_xids: NotRequired[list[int]]
    """XIDs that are an application's fault, not the GPU's (default: NVIDIA device plugin's list)."""
    fatal: NotRequired[list[str]]
    """Findings that fail a node; the others are only reported."""
    on_failure: NotRequired[str]
    """replace: abandon a failing new node, mark a failing running node Unhealthy; notify: report only."""
    dcgm_diag: NotRequired[bool]
    """Run DCGM's quick diagnostic (`dcgmi diag -r 1`) at launch where dcgmi is installed (not with mig)."""
    stuck_alarm_minutes: NotRequired[int]
    """Notify when GPUs stay busy-but-flat, or nodes in service publish no GPU metric, this long."""


class MigSettings(TypedDict):
    """A node group's `mig`: the MIG instances every GPU is split into."""

    profile: NotRequired[str]
    """Split every GPU into instances of this profile, e.g. 1g.10gb (docs: guides/mig.md)."""
    count: NotRequired[int]
    """With profile: instances per GPU (default: as many as fit, e.g. 7 x 1g.10gb on an H100)."""
    profiles: NotRequired[list[str]]
    """Instead of profile: the instances of each GPU, e.g. [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]."""


class WarmPoolSettings(TypedDict):
    """A node group's `warm_pool`: stopped instances kept ready (EBS billed, no instance hours)."""

    min_size: NotRequired[int]
    """Stopped instances kept ready even when the group is at zero (EBS billed, no instance hours)."""
    max_prepared: NotRequired[int]
    """Cap on running + warm instances (default: the group's max_nodes)."""
    reuse_on_scale_in: NotRequired[bool]
    """Return a scaled-in node to the pool (stopped) instead of terminating it."""


class NodeGroupSettings(TypedDict):
    """One entry of the stack file's `node_groups`: instance types, sizes, capacity, EFA, disks, AMI."""

    name: str
    """Unique within the stack; used in resource names and the ASG tag."""
    instance_types: list[str]
    """Preference order: the first is tried first; the rest are fallbacks."""
    min_nodes: NotRequired[int]
    """The Auto Scaling group minimum, set at creation; afterwards the guardrails own it (see Guardrails)."""
    desired_nodes: NotRequired[int]
    """Nodes at creation; later changed by guardrails and users, not by Pulumi."""
    max_nodes: int
    """The Auto Scaling group maximum (and what the cost model prices at worst)."""
    availability_zones: NotRequired[list[str]]
    """Default: the network's first zone for EFA groups, all its zones otherwise."""
    capacity: NotRequired[CapacitySettings]
    """The on-demand / spot / reservation mix."""
    efa: NotRequired[str]
    """auto: on when every type supports EFA and the group can have more than one node."""
    placement_group: NotRequired[bool]
    """A cluster placement group; default: on for EFA groups not using a reservation or Capacity Block."""
    scratch_mount: NotRequired[str]
    """Where the RAID0 of the NVMe instance-store disks is mounted."""
    root_volume_size_gib: NotRequired[int]
    """Encrypted gp3 root volume size."""
    ami_id: NotRequired[str]
    """Pin an AMI instead of the Deep Learning AMI; set or change it to upgrade a group's AMI."""
    ami_ssm_parameter: NotRequired[str]
    """Another SSM parameter to read the AMI from; read once, when the group is created."""
    files: NotRequired[list[NodeFileSettings]]
    """Files written on every node at boot, before setup runs (e.g. the hook a pre_stop_command names)."""
    setup: NotRequired[list[str]]
    """Commands run once per node as root after the bootstrap, in order (unit gpucluster-setup)."""
    setup_script: NotRequired[str]
    """Instead of setup: a script of the project run the same way (relative to Pulumi.yaml's directory)."""
    container_image: NotRequired[str]
    """Pulled at boot (Docker; ECR login for ECR images) so the first job does not wait for it."""
    health_checks: NotRequired[HealthCheckSettings]
    """GPU health checks at launch and while running, and what a failing node gets."""
    mig: NotRequired[MigSettings]
    """Split every GPU into MIG instances at boot (A100, H100, H200, B200); jobs get one per rank."""
    warm_pool: NotRequired[WarmPoolSettings]
    """An Auto Scaling warm pool of stopped nodes (one on-demand type, no spot, no Capacity Block)."""


class FsxSettings(TypedDict):
    """A dataset's `fsx`: FSx for Lustre linked to its bucket."""

    deployment_type: NotRequired[str]
    """SCRATCH_2 for short jobs; PERSISTENT_2 keeps data through failures (both Lustre 2.15)."""
    storage_capacity_gib: NotRequired[int]
    """1200, or a multiple of 2400 (FSx for Lustre SCRATCH_2 / PERSISTENT_2 rule)."""
    throughput_per_unit_mib: NotRequired[int]
    """PERSISTENT_2 only: MB/s per TiB of storage."""
    availability_zone: NotRequired[str]
    """Default: the zone of the first node group; must be a zone a node group runs in."""
    mount_path: NotRequired[str]
    """Where nodes mount it: the data prefix at <mount_path>/data, checkpoints at .../checkpoints."""
    automatic_backup_retention_days: NotRequired[int]
    """PERSISTENT_2 only: days of daily automatic backups kept (1-90; SCRATCH_2 has no backups)."""
    client_key_fingerprints: NotRequired[list[str]]
    """Pins AWS's Lustre client apt key: nodes install the client only if each key in it is one of these."""


class DatasetSettings(TypedDict):
    """One entry of the stack file's `datasets`: an S3 bucket and how its data reaches the GPUs."""

    name: str
    """Unique within the stack; used in resource names."""
    bucket_name: NotRequired[str]
    """Created buckets: optional (Pulumi adds a unique suffix); existing: required."""
    existing: NotRequired[bool]
    """Use an existing bucket; read-only unless checkpoint_prefix is set."""
    prefix: NotRequired[str]
    """The data the nodes read."""
    checkpoint_prefix: NotRequired[str]
    """Where nodes write checkpoints, e.g. `checkpoints/` (the only prefix nodes may write)."""
    access: NotRequired[str]
    """How the data reaches the GPUs: copy to NVMe at boot, Mountpoint for S3, or FSx for Lustre."""
    mount_path: NotRequired[str]
    """Where `mount` mounts the bucket (default /data/<name>)."""
    fsx: NotRequired[FsxSettings]
    """FSx for Lustre linked to the bucket (with access: fsx)."""
    noncurrent_version_expiration_days: NotRequired[int]
    """Created buckets: old versions under checkpoint_prefix expire after this; current ones never do."""
    expected_bucket_owner: NotRequired[str]
    """Existing buckets: the account that must own it (default: the deploying account)."""
    newer_noncurrent_versions: NotRequired[int]
    """Created buckets: this many newest old versions of each checkpoint are kept whatever their age."""


class BudgetSettings(TypedDict):
    """The stack file's `budget`: monthly limit, alerts and the scale-to-zero action."""

    monthly_limit_usd: float
    """Monthly cost budget for resources tagged with this stack."""
    alert_thresholds_percent: NotRequired[list[float]]
    """Actual-spend alerts, ascending; a forecast alert at 100 % is always added."""
    emails: NotRequired[list[str]]
    """AWS Budgets allows at most 10 e-mail subscribers per notification."""
    action_threshold_percent: NotRequired[float]
    """At this share of the limit every node group is scaled to zero (never deleted)."""
    report: NotRequired[str]
    """Opt-in spend report to the guardrail topic: Mondays, or the month's last day (08:00 UTC)."""
    check_minutes: NotRequired[int]
    """With action_threshold_percent: check spend this often; stop before it crosses the threshold."""
    max_usd_per_hour: NotRequired[float]
    """Also stop compute when the stack burns more than this per hour (the spend guard's check)."""


class NotificationsSettings(TypedDict):
    """The stack file's `notifications`: who the guardrail topic tells."""

    emails: NotRequired[list[str]]
    """E-mail subscribers of the guardrail topic (budget.emails are subscribed too); each confirms once."""


class AutoStopSettings(TypedDict):
    """The stack file's `autostop`: idle stop, schedules, maximum lifetime and the pre-stop hook."""

    enabled: NotRequired[bool]
    """Create the idle alarms, schedules and the auto-stop Lambda."""
    idle_minutes: NotRequired[int]
    """No GPU process and no gpucluster job on any node of a group this long -> it is stopped."""
    gpu_utilization_threshold_percent: NotRequired[float]
    """Also idle when even the busiest GPU stays below this for idle_minutes, at least an hour."""
    stop_schedule: NotRequired[str]
    """EventBridge cron, e.g. cron(0 20 ? * MON-FRI *): scale every group to zero."""
    start_schedule: NotRequired[str]
    """EventBridge cron: restore groups the stop schedule stopped."""
    schedule_timezone: NotRequired[str]
    """IANA time zone the schedules are read in."""
    max_lifetime_hours: NotRequired[int]
    """Stop a group whose oldest node has run this long."""
    pre_stop_command: NotRequired[str]
    """Run on every node (through SSM) before a stop, e.g. to checkpoint."""
    pre_stop_timeout_seconds: NotRequired[int]
    """Bounded wait for the pre-stop hook; the auto-stop Lambda has 15 minutes in all."""


class SpotSettings(TypedDict):
    """The stack file's `spot`: the spot-interruption hook."""

    interruption_command: NotRequired[str]
    """Run on a node when AWS warns it of a spot interruption (2 minutes' notice)."""
    interruption_timeout_seconds: NotRequired[int]
    """Bounded wait for the hook; the warning comes 2 minutes ahead."""
    handle_rebalance: NotRequired[bool]
    """Also run the hook on the earlier EC2 Instance Rebalance Recommendation."""


class PrometheusSettings(TypedDict):
    """The stack file's `observability.prometheus`: where the nodes' GPU metrics go."""

    enabled: NotRequired[bool]
    """Create an Amazon Managed Service for Prometheus workspace of the stack; every node writes to it."""
    remote_write_url: NotRequired[str]
    """Instead of enabled: the remote-write URL of an existing AMP workspace of the same partition."""
    region: NotRequired[str]
    """With remote_write_url: the workspace's region (SigV4 signs for it)."""
    dcgm_exporter_image: NotRequired[str]
    """NVIDIA's dcgm-exporter image pinned by digest (nvcr.io/nvidia/k8s/dcgm-exporter:<tag>@sha256:...)."""
    scrape_interval_seconds: NotRequired[int]
    """How often every node samples its GPUs; AMP's ingestion cost scales with 60 / this."""


class GrafanaSettings(TypedDict):
    """The stack file's `observability.grafana`: an Amazon Managed Grafana workspace, or none."""

    enabled: NotRequired[bool]
    """Create an Amazon Managed Grafana workspace reading the stack's Prometheus workspace."""
    authentication_providers: NotRequired[list[str]]
    """Required with enabled: AWS_SSO (IAM Identity Center) and/or SAML (Grafana has no other sign-in)."""
    saml_metadata_url: NotRequired[str]
    """With SAML: where the identity provider publishes its SAML metadata."""
    saml_editor_role_values: NotRequired[list[str]]
    """With SAML: the role attribute values that make a user an editor."""
    editors: NotRequired[int]
    """Editor (and admin) users, for the cost model (AMG bills each active user per month)."""
    viewers: NotRequired[int]
    """Viewer users, for the cost model."""


class ObservabilitySettings(TypedDict):
    """The stack file's `observability`: GPU metrics in Prometheus and Grafana (off by default)."""

    prometheus: NotRequired[PrometheusSettings]
    """dcgm-exporter, node exporter and a collector on every node, remote-writing to AMP."""
    grafana: NotRequired[GrafanaSettings]
    """An Amazon Managed Grafana workspace, or none when the team has its own Grafana."""
class ImageGroupSettings(TypedDict):
    """One entry of `images.groups`: opt out, and the pinned baked image."""

    bake: NotRequired[bool]
    """Bake this group's image (default: the section's bake); false opts the group out."""
    ami_id: NotRequired[str]
    """The baked image this group launches from: set or change it to move the group to a new build."""
    driver: NotRequired[str]
    """The NVIDIA driver the pinned image carries (as `gpucluster image build` recorded it)."""
    cuda: NotRequired[str]
    """The CUDA version the pinned image's driver supports (as recorded by the build)."""


class ImagesSettings(TypedDict):
    """The stack file's `images`: EC2 Image Builder baking for the node groups."""

    bake: NotRequired[bool]
    """Bake an EC2 Image Builder image for every node group (a group may opt out under groups)."""
    version: NotRequired[str]
    """The recipes' version: raise it to change what is baked (Image Builder recipes are immutable)."""
    schedule: NotRequired[str]
    """Also run the pipelines on this EventBridge-style cron (default: only `gpucluster image build`)."""
    schedule_timezone: NotRequired[str]
    """The timezone of schedule."""
    build_instance_type: NotRequired[str]
    """The GPU instance the image is built and tested on (any NVIDIA type runs the same driver)."""
    groups: NotRequired[dict[str, ImageGroupSettings]]
    """Per node group: opt out, and the pinned image it launches from."""


class SlurmLoginSettings(TypedDict):
    """The login node group: where users run sbatch/srun/squeue (reached through SSM, no SSH port)."""

    instance_type: NotRequired[str]
    """A CPU instance type: users submit jobs here, they do not run them (no GPUs)."""
    count: NotRequired[int]
    """Login nodes, always running (static capacity)."""


class SchedulerSettings(TypedDict):
    """The stack file's `scheduler`: gpucluster's own launcher, or Slurm on an AWS PCS cluster."""

    type: NotRequired[str]
    """`none`: Auto Scaling groups and `gpucluster run`; `slurm`: an AWS PCS cluster, jobs through sbatch."""
    slurm_version: NotRequired[str]
    """The PCS cluster's Slurm major version (24.11, 25.05 or 25.11); the AMI must carry the same."""
    size: NotRequired[str]
    """The PCS controller size (how many nodes and jobs it manages; priced by size)."""
    accounting: NotRequired[bool]
    """Slurm accounting (sacct, `spend --by user/job`); PCS cannot turn it off later without a new cluster."""
    ami_id: NotRequired[str]
    """An AMI with the AWS PCS agent and Slurm of slurm_version, for every group without a baked image."""
    login: NotRequired[SlurmLoginSettings]
    """The login node group."""
class NodeScriptsSource(TypedDict):
    """Where nodes fetch the node scripts bundle: a NodeScripts component's bucket and its account."""

    bucket_name: pulumi.Input[str]
    """The bucket holding node-scripts/<sha256>.tar (NodeScripts.bucket_name)."""
    owner: pulumi.Input[str]
    """The 12-digit account owning it (NodeScripts.bucket_owner): nodes read it only from that account."""


# The pydantic model each settings type is checked with (a test keeps their keys in step).
SETTINGS_MODELS: dict[type, type[BaseModel]] = {
    ClusterSettings: ClusterConfig,
    NetworkSettings: NetworkConfig,
    NodeGroupSettings: NodeGroupConfig,
    DatasetSettings: DatasetConfig,
    BudgetSettings: BudgetConfig,
    AutoStopSettings: AutoStopConfig,
    SpotSettings: SpotConfig,
    HealthCheckSettings: HealthCheckConfig,
    ObservabilitySettings: ObservabilityConfig,
    PrometheusSettings: PrometheusConfig,
    GrafanaSettings: GrafanaConfig,
    WarmPoolSettings: WarmPoolConfig,
    ImagesSettings: ImagesConfig,
    ImageGroupSettings: ImageGroupConfig,
    SchedulerSettings: SchedulerConfig,
    SlurmLoginSettings: SlurmLoginConfig,
    NotificationsSettings: NotificationsConfig,
}

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


def input_of(rule: Any) -> Any:
    """A `pulumi.Input` field: checked by `rule` when it is a plain value, taken as is when an Output."""
    adapter: TypeAdapter[Any] = TypeAdapter(rule)

    def check(value: Any) -> Any:
        if not is_plain(value):
            return value
        try:
            return adapter.validate_python(value)
        except ValidationError as exc:
            raise ValueError(validation_findings(exc)[0].message) from None

    return Annotated[Any, AfterValidator(check)]


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
    access: field_rule(DatasetConfig, "access")
    bucket_name: input_of(BucketName)
    prefix: S3Prefix = ""
    path: AbsolutePath
    fsx_dns_name: Any = None
    fsx_mount_name: Any = None
    fsx_client_key_fingerprints: field_rule(FsxConfig, "client_key_fingerprints") = Field(
        default_factory=list)
    expected_bucket_owner: input_of(AccountId | None) = None


class BucketGrantModel(StrictModel):
    """Node access to one bucket (NodeIdentityArgs.s3_grants)."""

    bucket_name: input_of(BucketName)
    prefix: S3Prefix = ""
    write: bool = False
    expected_bucket_owner: AccountId | None = None


class ClusterNetworkModel(StrictModel):
    """ClusterNetworkArgs, checked: the stack file's network rules plus each group's network needs."""

    cluster_name: Name
    region: Region
    availability_zones: field_rule(NetworkConfig, "availability_zones")
    vpc_cidr: field_rule(NetworkConfig, "vpc_cidr") = None
    nat_gateway: bool = True
    existing_vpc_id: input_of(VpcId) = None
    existing_subnet_ids: dict[AvailabilityZone, input_of(SubnetId)] = Field(default_factory=dict)
    tags: Tags = Field(default_factory=dict)
    node_groups: list[GroupNetworkModel] = Field(default_factory=list)
    flow_logs: field_rule(NetworkConfig, "flow_logs") = "reject"
    permissions_boundary: PolicyName | None = None


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

    bucket_name: input_of(BucketName)
    owner: input_of(AccountId)


class GpuNodeGroupModel(StrictModel):
    """GpuNodeGroupArgs, checked: the node group as the stack file checks it, plus where it runs."""

    node_group: NodeGroupConfig
    cluster_name: Name
    region: Region
    identity: Identity
    subnet_ids: input_of(Annotated[list[input_of(SubnetId)], Field(min_length=1)])
    security_group_ids: input_of(
        Annotated[list[input_of(SecurityGroupId)], Field(min_length=1, max_length=5)])
    placement_group_name: input_of(NonEmpty | None) = None
    instance_profile_arn: input_of(Arn)
    tags: Tags = Field(default_factory=dict)
    spot: SpotConfig = SpotConfig()
    data_mounts: list[DataMountModel] = Field(default_factory=list)
    autostop: AutoStopConfig | None = None
    node_role_name: input_of(NonEmpty | None) = None
    notify_topic_arn: input_of(Annotated[str, _matches(r"(arn:aws[a-z-]*:sns:[^\s]+)?",
                                                       "must be an SNS topic ARN or empty")]) = ""
    notify_key_arn: input_of(Annotated[str, _matches(r"(arn:aws[a-z-]*:kms:[^\s]+)?",
                                                     "must be a KMS key ARN or empty")]) = ""
    observability: ObservabilityConfig = ObservabilityConfig()
    remote_write_url: input_of(str) = ""
    image: ImageGroupConfig | None = None
    scheduler: Literal["none", "slurm"] = "none"
    slurm_ami_id: field_rule(NodeGroupConfig, "ami_id") = None
    node_scripts: NodeScriptsSourceModel | None = None


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
    bucket_name: input_of(BucketName)
    vpc_id: input_of(VpcId)
    subnet_id: input_of(SubnetId)
    node_security_group_ids: dict[Name, input_of(SecurityGroupId)] = Field(default_factory=dict)
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
    asg_name: input_of(AsgName)
    asg_arn: input_of(AsgArn)
    can_run_spot: bool
    capacity_block_reservation_id: field_rule(CapacityConfig, "capacity_reservation_id") = None


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
    notify_emails: field_rule(NotificationsConfig, "emails") = Field(default_factory=list)


def guardrails_checks(m: GuardrailsModel) -> Iterable[Finding]:
    yield from unique_name_findings([g.name for g in m.groups], "groups", "group")
    if m.budget is not None:
        yield from budget_findings(m.budget)
    yield from autostop_findings(m.autostop)


class DashboardGroupModel(StrictModel):
    """One node group on the dashboard (ClusterDashboardArgs.groups)."""

    name: Name
    asg_name: input_of(AsgName)
    stuck_alarm_minutes: field_rule(HealthCheckConfig, "stuck_alarm_minutes") = None
    mig: bool = False


class ClusterDashboardModel(StrictModel):
    """ClusterDashboardArgs, checked."""

    cluster_name: Name
    identity: Identity
    region: Region
    groups: Annotated[list[DashboardGroupModel], Field(min_length=1, max_length=20)]
    notify_topic_arn: input_of(Arn | None) = None
    guardrail_log_groups: list[input_of(NonEmpty)] = Field(default_factory=list)
    alarm_arns: list[input_of(Arn)] = Field(default_factory=list)
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
