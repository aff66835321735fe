"""The pydantic models of a stack file: one per section (`NodeGroupConfig`, `DatasetConfig`, ...) and
`StackSpec`, the validated whole with where it is deployed.

Fields carry their own types and docstrings (`field_docs` reads them for the reference); rules that
span fields are named checks in the section modules, not validators here. Never imports Pulumi or AWS.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from functools import cache
from itertools import pairwise
from typing import Annotated, Literal, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from gpucluster import catalog
from gpucluster.fleet.tags import CLUSTER_TAG, STACK_TAG
from gpucluster.spec.fields import (
    DIY_ORGANIZATION,
    PROJECT,
    PULUMI_NAME,
    AccountId,
    AvailabilityZone,
    ContainerImage,
    Cron,
    Email,
    InstanceTypeName,
    KeyFingerprint,
    Name,
    Percent,
    PolicyName,
    ProjectPath,
    Region,
    RoleName,
    ShellCommand,
    StackName,
    TagValue,
    _check_bucket_name,
    _check_cidr,
    _check_mount_path,
    _check_node_file_path,
    _check_prefix,
    _check_timezone,
    _in_range,
    _matches,
    _off_or_in_range,
    _on_off,
    _unique,
    stack_identity,
    tag_key,
)


class StrictModel(BaseModel):
    """Unknown keys are errors; specs are immutable once validated.

    A field's docstring (the string under it) documents it: `field_docs` reads them when the
    reference or a schema needs them. Not pydantic's `use_attribute_docstrings`, which parses
    every model's source at import (a fifth of importing this module, on every command).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


@cache
def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> its docstring, the model's own over its bases' (as `use_attribute_docstrings`
    would set `description`): an annotated assignment followed by a string, cleaned like a docstring."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):  # no source (built at run time): no docstrings
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return {name: docs[name] for name in model.model_fields if name in docs}


# ------------------------------------------------------------------------- models


class CostTags(StrictModel):
    """The cost tags every resource carries (activate them as cost-allocation tags to see costs by them)."""

    owner: TagValue
    """Team or person accountable for the cluster (tag `owner`)."""
    cost_center: TagValue
    """Cost centre for your bills (tag `cost_center`; the budget filters on `gpucluster:stack`)."""
    environment: Annotated[str, _matches(r"[a-z][a-z0-9-]{0,31}",
                                         "must be lowercase like dev, staging or prod")]
    """`prod` gets the production policies; anything else is non-prod."""


class ClusterConfig(StrictModel):
    name: Name
    """Short name used in every resource name; the stack name is added to tags."""
    tags: CostTags
    """Required cost tags: owner, cost_center, environment."""
    extra_tags: dict[Annotated[str, tag_key()], TagValue] = {}
    """More tags for every resource (team, project, ...); keys under aws: and gpucluster: are reserved."""
    permissions_boundary: PolicyName | None = None
    """Policy name: the permissions boundary of every IAM role the stack creates (none by default)."""
    break_glass_role: RoleName | None = None
    """The only role that may delete versions in, or delete, the dataset buckets the stack creates."""


class NetworkConfig(StrictModel):
    availability_zones: Annotated[list[AvailabilityZone], Field(min_length=1, max_length=6),
                                  _unique("availability zones")]
    """Zones the cluster may use; EFA groups use exactly one of them."""
    vpc_cidr: Annotated[str, AfterValidator(_check_cidr)] | None = None
    """Create a VPC with this CIDR (private subnets, NAT, S3/SSM endpoints)."""
    nat_gateway: bool = True
    """Internet egress for nodes through one NAT gateway (created VPCs only)."""
    existing_vpc_id: Annotated[str, _matches(r"vpc-[0-9a-f]{8,17}",
                                             "must be a VPC id like vpc-0abc12345def67890")] | None = None
    """Use this VPC instead of creating one."""
    existing_subnets: dict[AvailabilityZone, Annotated[str, _matches(
        r"subnet-[0-9a-f]{8,17}", "must be a subnet id like subnet-0abc12345def67890")]] = {}
    """With existing_vpc_id: the private subnet to use in each availability zone."""
    flow_logs: Literal["reject", "all", "off"] = "reject"
    """VPC flow logs to a KMS-encrypted CloudWatch log group (90 days): rejected traffic, all, or off."""


CapacityMarket = Literal["mixed", "capacity_block"]


class CapacityConfig(StrictModel):
    market: CapacityMarket = "mixed"
    """`mixed`: on-demand base + spot above it; `capacity_block`: a purchased Capacity Block."""
    on_demand_base: Annotated[int, _in_range(0, 2000)] = 0
    """Nodes always bought on-demand (or from a reservation) before any spot."""
    spot_percent: Percent = 0
    """Share of nodes above the base that are spot, 0..100."""
    spot_allocation_strategy: Literal["price-capacity-optimized", "capacity-optimized",
                                      "capacity-optimized-prioritized",
                                      "lowest-price"] = "price-capacity-optimized"
    """How the ASG picks spot pools (AWS Auto Scaling allocation strategies)."""
    on_demand_allocation_strategy: Literal["prioritized", "lowest-price"] = "prioritized"
    """`prioritized` follows instance_types order for on-demand nodes."""
    base_commitment: Literal["none", "savings_plan", "reserved_instances"] = "none"
    """How the on-demand base is paid for; used by the cost model."""
    capacity_reservation_id: Annotated[str, _matches(
        r"cr-[0-9a-f]{8,17}", "must be a capacity reservation id like cr-0abc12345def67890")] | None = None
    """Targeted on-demand capacity reservation, or the Capacity Block's reservation id."""
    duration_hours: Annotated[int, _in_range(24, 4368)] | None = None
    """capacity_block only: the block's length in hours; the cost model prices the block for it."""
    instance_count: Annotated[int, _in_range(1, 2000)] | None = None
    """capacity_block only: the instances the block holds; max_nodes may not exceed it (Slurm: required)."""


class NodeFileConfig(StrictModel):
    path: Annotated[str, AfterValidator(_check_node_file_path)]
    """Where the file goes on every node of the group, e.g. /opt/gpucluster/hooks/drain.sh."""
    content: str | None = None
    """The file's text, written as is."""
    source: ProjectPath | None = None
    """Instead of content: a file of the project (relative to the directory holding Pulumi.yaml)."""
    mode: Annotated[str, _matches(r"0?[0-7]{3}", "must be octal permissions like 0644 or 0755")] = "0644"
    """Permissions, e.g. 0755 for a script a hook command runs."""


HealthFinding = Literal["gpu_count", "ecc", "page_retirement", "xid", "efa", "dcgm", "mig"]
"""What a node health check can find: too few GPUs visible to the driver, uncorrectable ECC errors,
a pending page retirement or row remap, an XID error, fewer EFA devices than the launch template
has, a failed DCGM quick diagnostic, or (MIG groups) a GPU not in MIG mode or without exactly the MIG
devices of the group's layout (`gpucluster.node` health-check.sh)."""
HEALTH_FINDINGS: tuple[HealthFinding, ...] = get_args(HealthFinding)
# NVIDIA's k8s-device-plugin (internal/rm/health.go) leaves these XIDs out of its GPU health: they
# are raised by an application's own fault (13 graphics engine exception, 31 MMU fault, 43 GPU
# stopped processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch
# timeout), and the GPU keeps working for other processes.
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
# How long a new node has to answer its launch check. A MIG group's first boot can be two: MIG mode
# on, a reboot where the GPU reset cannot take it (an A100 passed through to a VM: MIG user guide,
# "Enable MIG Mode"), the layout again, then the check; gpucluster-mig.service alone may take 20 min.
# Its default covers two boots of the plain default and the GPU resets; below its minimum (two plain
# boots) a node that needs the reboot would be abandoned, and every replacement with it. Estimates:
# not timed on AWS.
LAUNCH_TIMEOUT_MINUTES = 15
MIG_LAUNCH_TIMEOUT_MINUTES = 40
MIG_MIN_LAUNCH_TIMEOUT_MINUTES = 30


class HealthCheckConfig(StrictModel):
    enabled: bool = True
    """Check every node before it joins (launch lifecycle hook) and every interval_minutes after."""
    interval_minutes: Annotated[int, _in_range(1, 60)] = 5
    """How often a running node checks itself."""
    launch_timeout_minutes: Annotated[int, _in_range(5, 120)] | None = None
    """A new node that has not answered the launch check by then is abandoned; default 15, 40 with mig."""
    xid_window_minutes: Annotated[int, _in_range(1, 1440)] = 15
    """A running node counts XID errors of the last this many minutes (at launch: since boot)."""
    ignored_xids: Annotated[list[Annotated[int, _in_range(1, 999)]], Field(max_length=64),
                            _unique("ignored XIDs")] = list(APPLICATION_XIDS)
    """XIDs that are an application's fault, not the GPU's (default: NVIDIA device plugin's list)."""
    fatal: Annotated[list[HealthFinding], _unique("fatal findings")] = list(HEALTH_FINDINGS)
    """Findings that fail a node; the others are only reported."""
    on_failure: Literal["replace", "notify"] = "replace"
    """replace: abandon a failing new node, mark a failing running node Unhealthy; notify: report only."""
    dcgm_diag: bool = True
    """Run DCGM's quick diagnostic (`dcgmi diag -r 1`) at launch where dcgmi is installed (not with mig)."""
    stuck_alarm_minutes: Annotated[int, _in_range(10, 1440)] | None = None
    """Notify when GPUs stay busy-but-flat, or nodes in service publish no GPU metric, this long."""


MIG_PROFILE = r"[1-7]g\.\d{1,3}gb(\+me)?"
MigProfileName = Annotated[str, _matches(MIG_PROFILE, "must be a MIG profile name like 1g.10gb or 3g.40gb")]


class MigConfig(StrictModel):
    """The MIG instances every GPU of a node group is split into: one profile `count` times, or a list."""

    profile: MigProfileName | None = None
    """Split every GPU into instances of this profile, e.g. 1g.10gb (docs: guides/mig.md)."""
    count: Annotated[int, _in_range(1, 7)] | None = None
    """With profile: instances per GPU (default: as many as fit, e.g. 7 x 1g.10gb on an H100)."""
    profiles: Annotated[list[MigProfileName], Field(min_length=1, max_length=7)] | None = None
    """Instead of profile: the instances of each GPU, e.g. [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]."""


class WarmPoolConfig(StrictModel):
    min_size: Annotated[int, _in_range(0, 2000)] = 0
    """Stopped instances kept ready even when the group is at zero (EBS billed, no instance hours)."""
    max_prepared: Annotated[int, _in_range(0, 2000)] | None = None
    """Cap on running + warm instances (default: the group's max_nodes)."""
    reuse_on_scale_in: bool = False
    """Return a scaled-in node to the pool (stopped) instead of terminating it."""


class NodeGroupConfig(StrictModel):
    name: Name
    """Unique within the stack; used in resource names and the ASG tag."""
    instance_types: Annotated[list[InstanceTypeName], Field(min_length=1, max_length=20),
                              _unique("instance types")]
    """Preference order: the first is tried first; the rest are fallbacks."""
    min_nodes: Annotated[int, _in_range(0, 2000)] = 0
    """The Auto Scaling group minimum, set at creation; afterwards the guardrails own it (see Guardrails)."""
    desired_nodes: Annotated[int, _in_range(0, 2000)] = 0
    """Nodes at creation; later changed by guardrails and users, not by Pulumi."""
    max_nodes: Annotated[int, _in_range(1, 2000)]
    """The Auto Scaling group maximum (and what the cost model prices at worst)."""
    availability_zones: Annotated[list[AvailabilityZone], Field(min_length=1),
                                  _unique("availability zones")] | None = None
    """Default: the network's first zone for EFA groups, all its zones otherwise."""
    capacity: CapacityConfig = CapacityConfig()
    """The on-demand / spot / reservation mix."""
    efa: Annotated[Literal["auto", "on", "off"], BeforeValidator(_on_off)] = "auto"
    """auto: on when every type supports EFA and the group can have more than one node."""
    placement_group: bool | None = None
    """A cluster placement group; default: on for EFA groups not using a reservation or Capacity Block."""
    scratch_mount: Annotated[str, AfterValidator(_check_mount_path)] = "/scratch"
    """Where the RAID0 of the NVMe instance-store disks is mounted."""
    root_volume_size_gib: Annotated[int, _in_range(50, 16384)] = 200
    """Encrypted gp3 root volume size."""
    ami_id: Annotated[str, _matches(r"ami-[0-9a-f]{8,17}",
                                    "must be an AMI id like ami-0abc12345def67890")] | None = None
    """Pin an AMI instead of the Deep Learning AMI; set or change it to upgrade a group's AMI."""
    ami_ssm_parameter: Annotated[str, _matches(r"/[\w./-]+", "must be an SSM parameter path "
                                               "starting with /")] | None = None
    """Another SSM parameter to read the AMI from; read once, when the group is created."""
    files: list[NodeFileConfig] = []
    """Files written on every node at boot, before setup runs (e.g. the hook a pre_stop_command names)."""
    setup: list[ShellCommand] = []
    """Commands run once per node as root after the bootstrap, in order (unit gpucluster-setup)."""
    setup_script: ProjectPath | None = None
    """Instead of setup: a script of the project run the same way (relative to Pulumi.yaml's directory)."""
    container_image: ContainerImage | None = None
    """Pulled at boot (Docker; ECR login for ECR images) so the first job does not wait for it."""
    health_checks: HealthCheckConfig = HealthCheckConfig()
    """GPU health checks at launch and while running, and what a failing node gets."""
    mig: MigConfig | None = None
    """Split every GPU into MIG instances at boot (A100, H100, H200, B200); jobs get one per rank."""
    warm_pool: WarmPoolConfig | None = None
    """An Auto Scaling warm pool of stopped nodes (one on-demand type, no spot, no Capacity Block)."""

    @property
    def types(self) -> list[catalog.InstanceType]:
        return [t for name in self.instance_types if (t := catalog.get(name))]

    @property
    def mig_layout(self) -> tuple[str, ...]:
        """The MIG instances of each GPU, as the stack file names them (empty: MIG off).

        `profile` without `count` takes as many as fit the group's GPU (the `group_mig`
        check makes sure every type of the group agrees on that number).
        """
        m = self.mig
        if m is None:
            return ()
        if m.profiles is not None:
            return tuple(m.profiles)
        if m.profile is None:
            return ()
        if m.count is not None:
            return (m.profile,) * m.count
        for t in self.types:
            gpu = catalog.mig_gpu(t.name)
            if gpu is not None and m.profile in gpu.profiles:
                return (m.profile,) * gpu.profiles[m.profile].max_instances
        return ()

    @property
    def launch_timeout_minutes(self) -> int:
        """`health_checks.launch_timeout_minutes`, or its default: longer for a MIG group (a reboot)."""
        if self.health_checks.launch_timeout_minutes is not None:
            return self.health_checks.launch_timeout_minutes
        return MIG_LAUNCH_TIMEOUT_MINUTES if self.mig is not None else LAUNCH_TIMEOUT_MINUTES

    @property
    def slots_per_gpu(self) -> int:
        """Devices a job sees per GPU: its MIG instances, or 1 (the whole GPU)."""
        return len(self.mig_layout) or 1

    @property
    def efa_enabled(self) -> bool:
        """Resolved EFA: `auto` is on only where every type has EFA and nodes can be > 1."""
        if self.efa == "auto":
            return self.max_nodes > 1 and all(t.supports_efa for t in self.types)
        return self.efa == "on"

    @property
    def uses_placement_group(self) -> bool:
        """`placement_group`, or by default: EFA groups that launch neither into a reservation nor a block.

        A reservation's instances sit where the reservation was made: a new placement group would
        leave launches short of it (eksctl #7949, terraform-aws-eks #3730), so groups targeting
        one get a placement group only when asked. A Capacity Block never gets one.
        """
        if self.placement_group is not None:
            return self.placement_group
        cap = self.capacity
        return self.efa_enabled and cap.market != "capacity_block" and cap.capacity_reservation_id is None


class FsxConfig(StrictModel):
    deployment_type: Literal["SCRATCH_2", "PERSISTENT_2"] = "SCRATCH_2"
    """SCRATCH_2 for short jobs; PERSISTENT_2 keeps data through failures (both Lustre 2.15)."""
    storage_capacity_gib: Annotated[int, _in_range(1200, 1_200_000)] = 1200
    """1200, or a multiple of 2400 (FSx for Lustre SCRATCH_2 / PERSISTENT_2 rule)."""
    throughput_per_unit_mib: Literal[125, 250, 500, 1000] | None = None
    """PERSISTENT_2 only: MB/s per TiB of storage."""
    availability_zone: AvailabilityZone | None = None
    """Default: the zone of the first node group; must be a zone a node group runs in."""
    mount_path: Annotated[str, AfterValidator(_check_mount_path)] = "/fsx"
    """Where nodes mount it: the data prefix at <mount_path>/data, checkpoints at .../checkpoints."""
    automatic_backup_retention_days: Annotated[int, _in_range(0, 90)] = 7
    """PERSISTENT_2 only: days of daily automatic backups kept (1-90; SCRATCH_2 has no backups)."""
    client_key_fingerprints: Annotated[list[KeyFingerprint], Field(max_length=4)] = []
    """Pins AWS's Lustre client apt key: nodes install the client only if each key in it is one of these."""


class DatasetConfig(StrictModel):
    name: Name
    """Unique within the stack; used in resource names."""
    bucket_name: Annotated[str, AfterValidator(_check_bucket_name)] | None = None
    """Created buckets: optional (Pulumi adds a unique suffix); existing: required."""
    existing: bool = False
    """Use an existing bucket; read-only unless checkpoint_prefix is set."""
    prefix: Annotated[str, AfterValidator(_check_prefix)] = ""
    """The data the nodes read."""
    checkpoint_prefix: Annotated[str, AfterValidator(_check_prefix)] | None = None
    """Where nodes write checkpoints, e.g. `checkpoints/` (the only prefix nodes may write)."""
    access: Literal["copy_to_scratch", "mount", "fsx"] = "mount"
    """How the data reaches the GPUs: copy to NVMe at boot, Mountpoint for S3, or FSx for Lustre."""
    mount_path: Annotated[str, AfterValidator(_check_mount_path)] | None = None
    """Where `mount` mounts the bucket (default /data/<name>)."""
    fsx: FsxConfig | None = None
    """FSx for Lustre linked to the bucket (with access: fsx)."""
    noncurrent_version_expiration_days: Annotated[int, _in_range(1, 3650)] = 30
    """Created buckets: old versions under checkpoint_prefix expire after this; current ones never do."""
    expected_bucket_owner: AccountId | None = None
    """Existing buckets: the account that must own it (default: the deploying account)."""
    newer_noncurrent_versions: Annotated[int, _in_range(1, 100)] = 3
    """Created buckets: this many newest old versions of each checkpoint are kept whatever their age."""


class BudgetConfig(StrictModel):
    monthly_limit_usd: Annotated[float, _in_range(1, 10_000_000)]
    """Monthly cost budget for resources tagged with this stack."""
    alert_thresholds_percent: Annotated[list[Annotated[float, _in_range(1, 1000)]],
                                        Field(min_length=1, max_length=10)] = [50, 80, 100]
    """Actual-spend alerts, ascending; a forecast alert at 100 % is always added."""
    emails: Annotated[list[Email], Field(max_length=10), _unique("e-mails")] = []
    """AWS Budgets allows at most 10 e-mail subscribers per notification."""
    action_threshold_percent: Annotated[float, _in_range(1, 1000)] | None = None
    """At this share of the limit every node group is scaled to zero (never deleted)."""
    report: Literal["weekly", "monthly"] | None = None
    """Opt-in spend report to the guardrail topic: Mondays, or the month's last day (08:00 UTC)."""
    check_minutes: Annotated[int, _in_range(1, 15)] = 5
    """With action_threshold_percent: check spend this often; stop before it crosses the threshold."""
    max_usd_per_hour: Annotated[float, _in_range(0.01, 1_000_000)] | None = None
    """Also stop compute when the stack burns more than this per hour (the spend guard's check)."""


class NotificationsConfig(StrictModel):
    """Who the stack's guardrail topic tells: every stop and start, each failure after its retries."""

    emails: Annotated[list[Email], Field(max_length=10), _unique("e-mails")] = []
    """E-mail subscribers of the guardrail topic (budget.emails are subscribed too); each confirms once."""


class AutoStopConfig(StrictModel):
    enabled: bool = True
    """Create the idle alarms, schedules and the auto-stop Lambda."""
    idle_minutes: Annotated[int, _in_range(5, 1440)] = 60
    """No GPU process and no gpucluster job on any node of a group this long -> it is stopped."""
    gpu_utilization_threshold_percent: Annotated[float, _in_range(1, 100)] = 5
    """Also idle when even the busiest GPU stays below this for idle_minutes, at least an hour."""
    stop_schedule: Cron | None = None
    """EventBridge cron, e.g. cron(0 20 ? * MON-FRI *): scale every group to zero."""
    start_schedule: Cron | None = None
    """EventBridge cron: restore groups the stop schedule stopped."""
    schedule_timezone: Annotated[str, AfterValidator(_check_timezone)] = "UTC"
    """IANA time zone the schedules are read in."""
    max_lifetime_hours: Annotated[int, _in_range(1, 8760)] | None = None
    """Stop a group whose oldest node has run this long."""
    pre_stop_command: ShellCommand | None = None
    """Run on every node (through SSM) before a stop, e.g. to checkpoint."""
    pre_stop_timeout_seconds: Annotated[int, _in_range(10, 840)] = 300
    """Bounded wait for the pre-stop hook; the auto-stop Lambda has 15 minutes in all."""


class SpotConfig(StrictModel):
    interruption_command: ShellCommand | None = None
    """Run on a node when AWS warns it of a spot interruption (2 minutes' notice)."""
    interruption_timeout_seconds: Annotated[int, _in_range(5, 110)] = 90
    """Bounded wait for the hook; the warning comes 2 minutes ahead."""
    handle_rebalance: bool = True
    """Also run the hook on the earlier EC2 Instance Rebalance Recommendation."""


class PrometheusConfig(StrictModel):
    """Where the nodes' GPU metrics go: a workspace of the stack, or an existing one."""

    enabled: bool = False
    """Create an Amazon Managed Service for Prometheus workspace of the stack; every node writes to it."""
    remote_write_url: Annotated[str, Field(max_length=512)] | None = None
    """Instead of enabled: the remote-write URL of an existing AMP workspace of the same partition."""
    region: Region | None = None
    """With remote_write_url: the workspace's region (SigV4 signs for it)."""
    dcgm_exporter_image: ContainerImage | None = None
    """NVIDIA's dcgm-exporter image pinned by digest (nvcr.io/nvidia/k8s/dcgm-exporter:<tag>@sha256:...)."""
    prometheus_image: ContainerImage | None = None
    """With node_exporter_image: Prometheus's image pinned by digest, run instead of the OS's package."""
    node_exporter_image: ContainerImage | None = None
    """With prometheus_image: the node exporter's image pinned by digest, run instead of the OS's package."""
    scrape_interval_seconds: Annotated[int, _in_range(10, 300)] = 30
    """How often every node samples its GPUs; AMP's ingestion cost scales with 60 / this."""

    @property
    def active(self) -> bool:
        """Metrics are written somewhere: a workspace of the stack or an existing one."""
        return self.enabled or self.remote_write_url is not None

    @property
    def containers(self) -> bool:
        """Prometheus and the node exporter run as the pinned containers, not the OS's packages."""
        return self.prometheus_image is not None and self.node_exporter_image is not None


GrafanaAuthentication = Literal["AWS_SSO", "SAML"]


class GrafanaConfig(StrictModel):
    """An Amazon Managed Grafana workspace with the dashboards, or none (a team's own Grafana)."""

    enabled: bool = False
    """Create an Amazon Managed Grafana workspace reading the stack's Prometheus workspace."""
    authentication_providers: Annotated[list[GrafanaAuthentication], Field(max_length=2),
                                        _unique("authentication providers")] = []
    """Required with enabled: AWS_SSO (IAM Identity Center) and/or SAML (Grafana has no other sign-in)."""
    saml_metadata_url: Annotated[str, _matches(r"https://[^\s]{1,500}", "must be an https:// URL of the "
                                               "IdP's SAML metadata")] | None = None
    """With SAML: where the identity provider publishes its SAML metadata."""
    saml_editor_role_values: Annotated[list[TagValue], Field(max_length=10)] = []
    """With SAML: the role attribute values that make a user an editor."""
    editors: Annotated[int, _in_range(0, 10_000)] = 1
    """Editor (and admin) users, for the cost model (AMG bills each active user per month)."""
    viewers: Annotated[int, _in_range(0, 100_000)] = 0
    """Viewer users, for the cost model."""


class ObservabilityConfig(StrictModel):
    """GPU metrics in Prometheus and Grafana, beside the CloudWatch dashboard (off by default)."""

    prometheus: PrometheusConfig = PrometheusConfig()
    """dcgm-exporter, node exporter and a collector on every node, remote-writing to AMP."""
    grafana: GrafanaConfig = GrafanaConfig()
    """An Amazon Managed Grafana workspace, or none when the team has its own Grafana."""

    @property
    def active(self) -> bool:
        return self.prometheus.active or self.grafana.enabled
AmiId = Annotated[str, _matches(r"ami-[0-9a-f]{8,17}", "must be an AMI id like ami-0abc12345def67890")]
ImageVersion = Annotated[str, _matches(r"\d{1,4}\.\d{1,4}\.\d{1,4}",
                                       "must be a semantic version like 1.0.0 (Image Builder's x.y.z)")]


class ImageGroupConfig(StrictModel):
    bake: bool | None = None
    """Bake this group's image (default: the section's bake); false opts the group out."""
    ami_id: AmiId | None = None
    """The baked image this group launches from: set or change it to move the group to a new build."""
    driver: Annotated[str, _matches(r"[0-9][0-9.]{0,31}",
                                    "must be a driver version like 550.127.05")] | None = None
    """The NVIDIA driver the pinned image carries (as `gpucluster image build` recorded it)."""
    cuda: Annotated[str, _matches(r"[0-9][0-9.]{0,15}", "must be a CUDA version like 12.4")] | None = None
    """The CUDA version the pinned image's driver supports (as recorded by the build)."""
    volume_initialization_mibps: Annotated[int, _off_or_in_range(100, 300)] = 300
    """EBS initialization rate of the root volume made from the pinned image, MiB/s (100-300; 0: lazy)."""


class ImagesConfig(StrictModel):
    bake: bool = False
    """Bake an EC2 Image Builder image for every node group (a group may opt out under groups)."""
    version: ImageVersion = "1.0.0"
    """The recipes' version: raise it to change what is baked (Image Builder recipes are immutable)."""
    schedule: Cron | None = None
    """Also run the pipelines on this EventBridge-style cron (default: only `gpucluster image build`)."""
    schedule_timezone: Annotated[str, AfterValidator(_check_timezone)] = "UTC"
    """The timezone of schedule."""
    build_instance_type: InstanceTypeName = "g6.xlarge"
    """The GPU instance the image is built and tested on (any NVIDIA type runs the same driver)."""
    groups: dict[Name, ImageGroupConfig] = {}
    """Per node group: opt out, and the pinned image it launches from."""


# Slurm versions an AWS PCS cluster can run: 24.11 or newer (the floor; accounting needs 24.11,
# AWS PCS user guide "Slurm accounting in AWS PCS"), 25.05 (PCS since 2025-10, "AWS PCS supports Slurm
# v25.05") and 25.11 (the PCS Slurm installer's current version, "Software installers to build custom AMIs
# for AWS PCS"). See "Slurm versions in AWS PCS" for each version's end of support.
PCS_SLURM_VERSIONS = ("24.11", "25.05", "25.11")
SchedulerType = Literal["none", "slurm", "eks"]


class SlurmLoginConfig(StrictModel):
    """The login node group: where users run sbatch/srun/squeue (reached through SSM, no SSH port)."""

    # Any EC2 type by its name's shape: the catalog holds GPU types only, so InstanceTypeName would refuse
    # every CPU type (scheduler.py refuses a GPU one; the cost model prices the ones pcs_prices.yaml has).
    instance_type: Annotated[str, _matches(r"[a-z][a-z0-9-]*\.[a-z0-9-]+",
                                           "must be an EC2 instance type like m7i.large")] = "m7i.large"
    """A CPU instance type: users submit jobs here, they do not run them (no GPUs)."""
    count: Annotated[int, _in_range(1, 4)] = 1
    """Login nodes, always running (static capacity)."""


class EksSystemNodesConfig(StrictModel):
    """The small on-demand node group that runs the cluster's controllers (no GPUs)."""

    instance_type: Annotated[str, _matches(r"[a-z][a-z0-9-]*\.[a-z0-9-]+",
                                           "must be an EC2 instance type like m7i.large")] = "m7i.large"
    """A CPU instance type for Kueue, the autoscaler, the termination handler and CoreDNS."""
    count: Annotated[int, _in_range(1, 5)] = 2
    """System nodes, always running (two so a controller survives one node's loss)."""


class SchedulerConfig(StrictModel):
    """How work reaches the node groups: gpucluster's own launcher, Slurm on AWS PCS, or Kubernetes on EKS."""

    type: SchedulerType = "none"
    """`none`: Auto Scaling groups and `gpucluster run`; `slurm`: AWS PCS, sbatch; `eks`: EKS, Kueue."""
    slurm_version: str = "25.05"
    """The PCS cluster's Slurm major version (24.11, 25.05 or 25.11); the AMI must carry the same."""
    size: Literal["small", "medium", "large"] = "small"
    """The PCS controller size (how many nodes and jobs it manages; priced by size)."""
    accounting: bool = True
    """Slurm accounting (sacct, `spend --by user/job`); PCS cannot turn it off later without a new cluster."""
    ami_id: AmiId | None = None
    """An AMI with the AWS PCS agent and Slurm of slurm_version, for every group without a baked image."""
    login: SlurmLoginConfig = SlurmLoginConfig()
    """The login node group."""
    kubernetes_version: Annotated[str, _matches(r"1\.[0-9]{2}", "must be a Kubernetes version like 1.33")] \
        | None = None
    """The EKS cluster's Kubernetes version (default: the catalog's newest in standard support)."""
    endpoint_public: bool = False
    """Also expose the EKS API endpoint publicly (default: private, reached from the VPC)."""
    teams: list[Name] = []
    """Team namespaces, each with a Kueue LocalQueue on the cluster's GPU queue."""
    max_run_minutes: Annotated[int, _in_range(10, 43200)] = 1440
    """A job's default maximum run time on EKS (Kueue's maximum execution time) unless it sets its own."""
    system_nodes: EksSystemNodesConfig = EksSystemNodesConfig()
    """The EKS system node group for controllers."""

    @property
    def slurm(self) -> bool:
        return self.type == "slurm"

    @property
    def eks(self) -> bool:
        return self.type == "eks"


class StackConfig(StrictModel):
    """Everything under the `gpucluster:` namespace of a stack file."""

    cluster: ClusterConfig
    """Name and tags."""
    network: NetworkConfig
    """A new VPC or an existing one, and the availability zones."""
    node_groups: Annotated[list[NodeGroupConfig], Field(min_length=1, max_length=20)]
    """GPU node groups, each an Auto Scaling group."""
    datasets: list[DatasetConfig] = []
    """S3 datasets and how they reach the GPUs."""
    budget: BudgetConfig | None = None
    """Monthly budget, alerts and the scale-to-zero action."""
    notifications: NotificationsConfig = NotificationsConfig()
    """Who is told what the guardrails did and when they failed (required: every stack has guardrails)."""
    autostop: AutoStopConfig = AutoStopConfig(enabled=False)
    """Idle stop, schedules, maximum lifetime and the pre-stop hook (off when absent)."""
    spot: SpotConfig = SpotConfig()
    """The spot-interruption hook."""
    observability: ObservabilityConfig = ObservabilityConfig()
    """GPU metrics to Amazon Managed Prometheus, Grafana dashboards (off when absent)."""
    images: ImagesConfig = ImagesConfig()
    """Images baked by EC2 Image Builder for the node groups (off when absent)."""
    scheduler: SchedulerConfig = SchedulerConfig()
    """`none` (the launcher, the default) or `slurm`: an AWS PCS cluster with a queue per node group."""


PulumiName = Annotated[str, _matches(PULUMI_NAME, "must be 1-100 characters of letters, digits, "
                                     "'-', '_' and '.' (a Pulumi name)")]


class StackSpec(StackConfig):
    """A validated stack: its config plus where it is deployed (organization, project, stack) and region."""

    stack: StackName
    project: PulumiName = PROJECT
    organization: PulumiName = DIY_ORGANIZATION
    """The Pulumi organization (`gpucluster:organization`; a self-managed backend's is `organization`)."""
    region: Region

    @property
    def subscribers(self) -> list[str]:
        """The guardrail topic's e-mail subscribers: notifications.emails, then the other budget.emails."""
        return list(dict.fromkeys([*self.notifications.emails, *(self.budget.emails if self.budget else [])]))

    @property
    def identity(self) -> str:
        """This deployment's identity (`stack_identity`): the `gpucluster:stack` tag value."""
        return stack_identity(self.organization, self.project, self.stack, self.cluster.name)

    def azs_of(self, group: NodeGroupConfig) -> list[str]:
        """The zones a node group runs in (one for EFA groups unless set otherwise)."""
        if group.availability_zones:
            return list(group.availability_zones)
        zones = self.network.availability_zones
        return [zones[0]] if group.efa_enabled or group.uses_placement_group else list(zones)

    @property
    def node_group_zones(self) -> set[str]:
        return {az for group in self.node_groups for az in self.azs_of(group)}

    @property
    def tags(self) -> dict[str, str]:
        """Tags for every resource: cost tags, extra tags and the deployment's identity."""
        return {
            **self.cluster.extra_tags,
            "owner": self.cluster.tags.owner,
            "cost_center": self.cluster.tags.cost_center,
            "environment": self.cluster.tags.environment,
            STACK_TAG: self.identity,
            CLUSTER_TAG: self.cluster.name,
        }


def can_run_spot(group: NodeGroupConfig) -> bool:
    """True when the group may hold spot nodes: a spot share and room above the on-demand base."""
    cap = group.capacity
    return cap.market == "mixed" and cap.spot_percent > 0 and group.max_nodes > cap.on_demand_base


def baked_image(images: ImagesConfig, group: NodeGroupConfig) -> ImageGroupConfig | None:
    """The group's image settings when it is baked (the section's bake, or its own opt-in/out), else None."""
    own = images.groups.get(group.name, ImageGroupConfig())
    bake = own.bake if own.bake is not None else images.bake
    return own if bake else None


def launches_baked(images: ImagesConfig, group: NodeGroupConfig) -> bool:
    """True when the group launches from a pinned baked image (its launch path installs nothing)."""
    image = baked_image(images, group)
    return image is not None and image.ami_id is not None
