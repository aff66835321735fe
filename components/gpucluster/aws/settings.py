"""The stack file's sections as typed dicts: what a component takes for a node group, a budget, ...

Each settings type (`NodeGroupSettings`, `BudgetSettings`, ...) spells one stack-file
section as a `TypedDict`, key for key and with the same docstrings as the pydantic
models of `gpucluster.spec`, so a component takes a node group or a budget exactly as a
stack file writes it, and Pulumi's schema analyzer turns them into package types.
`SETTINGS_MODELS` names the model each one is checked with (`aws/args.py` validates).
It holds no rule of its own and imports no Pulumi. No `from __future__ import annotations`:
the schema analyzer reads these annotations at runtime.
"""

from typing import NotRequired, TypedDict

from pydantic import BaseModel

from gpucluster.spec import (
    AutoStopConfig,
    BudgetConfig,
    ClusterConfig,
    DatasetConfig,
    EksSystemNodesConfig,
    GrafanaConfig,
    HealthCheckConfig,
    ImageGroupConfig,
    ImagesConfig,
    NetworkConfig,
    NodeGroupConfig,
    NotificationsConfig,
    ObservabilityConfig,
    PrometheusConfig,
    SchedulerConfig,
    SlurmLoginConfig,
    SpotConfig,
    WarmPoolConfig,
)


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
    prometheus_image: NotRequired[str]
    """With node_exporter_image: Prometheus's image pinned by digest, run instead of the OS's package."""
    node_exporter_image: NotRequired[str]
    """With prometheus_image: the node exporter's image pinned by digest, run instead of the OS's package."""
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
    volume_initialization_mibps: NotRequired[int]
    """EBS initialization rate of the root volume made from the pinned image, MiB/s (100-300; 0: lazy)."""


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


class EksSystemNodesSettings(TypedDict):
    """The EKS system node group: the cluster's controllers (no GPUs)."""

    instance_type: NotRequired[str]
    """A CPU instance type for Kueue, the autoscaler, the termination handler and CoreDNS."""
    count: NotRequired[int]
    """System nodes, always running (two so a controller survives one node's loss)."""


class SchedulerSettings(TypedDict):
    """The stack file's `scheduler`: gpucluster's own launcher, Slurm on AWS PCS, or Kubernetes on EKS."""

    type: NotRequired[str]
    """`none`: Auto Scaling groups and `gpucluster run`; `slurm`: AWS PCS, sbatch; `eks`: EKS, Kueue."""
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
    kubernetes_version: NotRequired[str]
    """The EKS cluster's Kubernetes version (default: the catalog's newest in standard support)."""
    endpoint_public: NotRequired[bool]
    """Also expose the EKS API endpoint publicly (default: private, reached from the VPC)."""
    teams: NotRequired[list[str]]
    """Team namespaces, each with a Kueue LocalQueue on the cluster's GPU queue."""
    max_run_minutes: NotRequired[int]
    """A job's default maximum run time on EKS (Kueue's maximum execution time) unless it sets its own."""
    system_nodes: NotRequired[EksSystemNodesSettings]
    """The EKS system node group for controllers."""


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
    EksSystemNodesSettings: EksSystemNodesConfig,
    NotificationsSettings: NotificationsConfig,
}
