"""The typed stack configuration: every key a stack file may hold, and all its validation.

A stack file (`stacks/Pulumi.<env>.yaml`) holds `aws:region` and the keys
`gpucluster:cluster`, `network`, `node_groups`, `datasets`, `budget`,
`autostop` and `spot`. `parse_stack_config` turns that mapping into a frozen
`StackSpec` or raises `SpecError` listing every problem at once, each as
`<key path>: <message>`. Nothing else in the toolkit validates config; it
must never import Pulumi or call AWS, so the same checks run offline in
`gpucluster plan` and inside `pulumi up` before any resource is declared.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Annotated, Any, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from gpucluster import catalog

PROJECT = "gpucluster"
REGION_KEY = "aws:region"
MAX_BUDGET_NOTIFICATIONS = 10

# --------------------------------------------------------------------------- errors


@dataclass(frozen=True)
class Finding:
    """One problem in a stack's config, at a key path such as `node_groups[0].max_nodes`."""

    path: str
    message: str
    level: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """Invalid stack config; `findings` holds every error, one line each in `str()`."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        super().__init__("\n".join(str(f) for f in findings))


# ------------------------------------------------------------------ field validators


def _num(value: float) -> str:
    """140.0 -> '140', 2.5 -> '2.5', 10000000 -> '10000000' (never exponent notation)."""
    return str(int(value)) if float(value).is_integer() else str(value)


def _in_range(lo: float, hi: float) -> AfterValidator:
    def check(value: float) -> float:
        if not lo <= value <= hi:
            raise ValueError(f"must be {_num(lo)}..{_num(hi)}, got {_num(value)}")
        return value

    return AfterValidator(check)


def _matches(pattern: str, what: str) -> AfterValidator:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{what}, got {value!r}")
        return value

    return AfterValidator(check)


def _check_email(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._%+'-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}", value):
        raise ValueError(f"not a valid e-mail address, got {value!r}")
    return value


def _check_instance_type(value: str) -> str:
    if catalog.get(value) is None:
        hint = difflib.get_close_matches(value, catalog.names(), n=1, cutoff=0.6)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        raise ValueError(f"unknown instance type {value!r}{suggestion} (see `gpucluster recommend`"
                         " or components/gpucluster/catalog/data/instance_types.yaml)")
    return value


def _check_absolute_path(value: str) -> str:
    if not value.startswith("/") or value.rstrip("/") in ("", "/etc", "/usr", "/var", "/home",
                                                          "/boot", "/root", "/opt", "/tmp"):
        raise ValueError(f"must be an absolute path of its own (e.g. /scratch), got {value!r}")
    if not re.fullmatch(r"/[A-Za-z0-9._/-]+", value) or "//" in value or "/../" in value + "/":
        raise ValueError(f"must be a plain absolute path, got {value!r}")
    return value


def _check_prefix(value: str) -> str:
    if value.startswith("/"):
        raise ValueError(f"S3 prefixes do not start with '/', got {value!r}")
    if value and not value.endswith("/"):
        raise ValueError(f"must end with '/' (a folder-like prefix), got {value!r}")
    if not re.fullmatch(r"[A-Za-z0-9!_.*'()/-]*", value) or "//" in value:
        raise ValueError(f"must use S3 safe characters (letters, digits, ! - _ . * ' ( ) /), "
                         f"got {value!r}")
    return value


# S3 user guide, "General purpose bucket naming rules": reserved prefixes and suffixes.
BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def _check_bucket_name(value: str) -> str:
    """S3 general purpose bucket naming rules (S3 user guide, "Bucket naming rules")."""
    problems = []
    if not 3 <= len(value) <= 63:
        problems.append("3-63 characters")
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*[a-z0-9]", value):
        problems.append("lowercase letters, digits, '.' and '-', starting and ending with a "
                        "letter or digit")
    if ".." in value or ".-" in value or "-." in value:
        problems.append("no adjacent periods or period-hyphen pairs")
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", value):
        problems.append("not formatted as an IP address")
    if value.startswith(BUCKET_RESERVED_PREFIXES):
        problems.append("not starting with " + ", ".join(BUCKET_RESERVED_PREFIXES))
    if value.endswith(BUCKET_RESERVED_SUFFIXES):
        problems.append("not ending with a reserved suffix (" + ", ".join(BUCKET_RESERVED_SUFFIXES) + ")")
    if problems:
        raise ValueError(f"not a valid S3 bucket name ({'; '.join(problems)}), got {value!r}")
    return value


# pulumi-aws s3.Bucket `bucket_prefix`: at most 37 characters; the provider appends a unique suffix.
BUCKET_PREFIX_MAX = 37


def generated_bucket_prefix(cluster_name: str, dataset_name: str) -> str:
    """The `bucket_prefix` of a created bucket without a bucket_name: `<cluster>-<dataset>-`."""
    return f"{cluster_name}-{dataset_name}"[:BUCKET_PREFIX_MAX - 1] + "-"


_CRON_FIELDS: list[tuple[str, int, int, dict[str, int]]] = [
    ("minutes", 0, 59, {}),
    ("hours", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, {m: i + 1 for i, m in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"])}),
    ("day-of-week", 1, 7, {d: i + 1 for i, d in enumerate(
        ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}),
    ("year", 1970, 2199, {}),
]


def _cron_value(token: str, lo: int, hi: int, names: dict[str, int]) -> int:
    value = names.get(token.upper()) if token.upper() in names else None
    if value is None:
        if not token.isdigit():
            raise ValueError(token)
        value = int(token)
    if not lo <= value <= hi:
        raise ValueError(token)
    return value


def _check_cron_field(text: str, lo: int, hi: int, names: dict[str, int], field: str) -> None:
    for part in text.split(","):
        base, _, step = part.partition("/")
        if step and (not step.isdigit() or int(step) == 0):
            raise ValueError(part)
        if base == "*":
            continue
        if field == "day-of-month" and re.fullmatch(r"L|LW|\d{1,2}W", base):
            continue
        if field == "day-of-week" and re.fullmatch(r"([1-7]|[A-Za-z]{3})(L|#[1-5])", base):
            _cron_value(re.split("[L#]", base)[0], lo, hi, names)
            continue
        start, _, end = base.partition("-")
        first = _cron_value(start, lo, hi, names)
        if end and _cron_value(end, lo, hi, names) < first and field != "day-of-week":
            raise ValueError(part)


def _check_cron(value: str) -> str:
    """An EventBridge cron expression: cron(min hour day-of-month month day-of-week year)."""
    match = re.fullmatch(r"cron\((.*)\)", value.strip())
    if not match:
        raise ValueError("must be an EventBridge cron expression like 'cron(0 20 ? * MON-FRI *)', "
                         f"got {value!r}")
    fields = match.group(1).split()
    if len(fields) != 6:
        raise ValueError(f"cron needs 6 fields (minutes hours day-of-month month day-of-week "
                         f"year), got {len(fields)} in {value!r}")
    for text, (field, lo, hi, names) in zip(fields, _CRON_FIELDS, strict=True):
        if text == "?":
            if field not in ("day-of-month", "day-of-week"):
                raise ValueError(f"'?' is only allowed in day-of-month or day-of-week, in {value!r}")
            continue
        try:
            _check_cron_field(text, lo, hi, names, field)
        except ValueError as bad:
            raise ValueError(f"invalid {field} field {text!r} ({bad}) in {value!r}") from None
    if (fields[2] == "?") == (fields[4] == "?"):
        raise ValueError("exactly one of day-of-month and day-of-week must be '?' "
                         f"(EventBridge rule), in {value!r}")
    return value


def _check_timezone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown IANA time zone, got {value!r} (e.g. UTC, Europe/Berlin)") from None
    return value


def _check_cidr(value: str) -> str:
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as bad:
        raise ValueError(f"not an IPv4 CIDR block ({bad}), got {value!r}") from None
    if not 16 <= net.prefixlen <= 22:
        raise ValueError(f"VPC CIDR must be /16../22 to fit the subnets, got /{net.prefixlen}")
    if not net.is_private:
        raise ValueError(f"VPC CIDR should be a private range (RFC 1918), got {value!r}")
    return value


def _on_off(value: Any) -> Any:
    """YAML 1.1 readers (PyYAML) turn `on`/`off` into booleans; Pulumi's YAML 1.2 does not."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


def _unique(what: str) -> AfterValidator:
    def check(values: list[Any]) -> list[Any]:
        dupes = sorted({str(v) for v in values if values.count(v) > 1})
        if dupes:
            raise ValueError(f"{what} must be unique, repeated: {', '.join(dupes)}")
        return values

    return AfterValidator(check)


Percent = Annotated[float, _in_range(0, 100)]
Name = Annotated[str, _matches(r"[a-z][a-z0-9-]{0,22}[a-z0-9]",
                               "must be 2-24 characters of a-z, 0-9 and '-', starting with a "
                               "letter")]
TagValue = Annotated[str, _matches(r"[\w .:/=+@-]{1,256}",
                                   "must be 1-256 characters of letters, digits, spaces and "
                                   "_ . : / = + - @")]
Email = Annotated[str, AfterValidator(_check_email)]
InstanceTypeName = Annotated[str, AfterValidator(_check_instance_type)]
Cron = Annotated[str, AfterValidator(_check_cron)]
ZONE_NAME = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d[a-z]")
AvailabilityZone = Annotated[str, _matches(ZONE_NAME.pattern,
                                           "must be an availability zone name like us-east-1a")]
# At most 2048 characters: the command travels in a Lambda environment, which holds 4 KB in all
# (Lambda developer guide, "Working with Lambda environment variables").
ShellCommand = Annotated[str, _matches(r"(?s)\S.{0,2047}",
                                       "must be a non-empty shell command (at most 2048 chars)")]
# The field rules of the models below, by name, for component Args that take one value alone.
AbsolutePath = Annotated[str, AfterValidator(_check_absolute_path)]
S3Prefix = Annotated[str, AfterValidator(_check_prefix)]
BucketName = Annotated[str, AfterValidator(_check_bucket_name)]
Region = Annotated[str, _matches(r"[a-z]{2}(-gov)?-[a-z]+-\d", "must be a region like us-east-1")]


class StrictModel(BaseModel):
    """Unknown keys are errors; specs are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# ------------------------------------------------------------------------- models


class CostTags(StrictModel):
    """The cost-allocation tags every resource carries (and the budget filters on)."""

    owner: TagValue
    """Team or person accountable for the cluster (tag `owner`)."""
    cost_center: TagValue
    """Cost-allocation tag the budget filters on (tag `cost_center`)."""
    environment: Annotated[str, _matches(r"[a-z][a-z0-9-]{0,31}",
                                         "must be lowercase like dev, staging or prod")]
    """`prod` gets the production policies; anything else is non-prod."""


class ClusterConfig(StrictModel):
    name: Name
    """Short name used in every resource name; the stack name is added to tags."""
    tags: CostTags
    """Required cost tags: owner, cost_center, environment."""
    extra_tags: dict[Annotated[str, _matches(r"(?!aws:)[\w .:/=+@-]{1,128}",
                                             "tag keys are 1-128 characters and do not start "
                                             "with aws:")], TagValue] = {}
    """More tags for every resource (team, project, ...)."""


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
    """A cluster placement group; default on for EFA groups, off otherwise."""
    scratch_mount: Annotated[str, AfterValidator(_check_absolute_path)] = "/scratch"
    """Where the RAID0 of the NVMe instance-store disks is mounted."""
    root_volume_size_gib: Annotated[int, _in_range(50, 16384)] = 200
    """Encrypted gp3 root volume size."""
    ami_id: Annotated[str, _matches(r"ami-[0-9a-f]{8,17}",
                                    "must be an AMI id like ami-0abc12345def67890")] | None = None
    """Override the default AWS Deep Learning AMI."""
    ami_ssm_parameter: Annotated[str, _matches(r"/[\w./-]+", "must be an SSM parameter path "
                                               "starting with /")] | None = None
    """Override the public SSM parameter the AMI is read from."""

    @property
    def types(self) -> list[catalog.InstanceType]:
        return [t for name in self.instance_types if (t := catalog.get(name))]

    @property
    def efa_enabled(self) -> bool:
        """Resolved EFA: `auto` is on only where every type has EFA and nodes can be > 1."""
        if self.efa == "auto":
            return self.max_nodes > 1 and all(t.supports_efa for t in self.types)
        return self.efa == "on"

    @property
    def uses_placement_group(self) -> bool:
        return self.efa_enabled if self.placement_group is None else self.placement_group


class FsxConfig(StrictModel):
    deployment_type: Literal["SCRATCH_2", "PERSISTENT_2"] = "SCRATCH_2"
    """SCRATCH_2 for short jobs; PERSISTENT_2 keeps data through failures (both Lustre 2.15)."""
    storage_capacity_gib: Annotated[int, _in_range(1200, 1_200_000)] = 1200
    """1200, or a multiple of 2400 (FSx for Lustre SCRATCH_2 / PERSISTENT_2 rule)."""
    throughput_per_unit_mib: Literal[125, 250, 500, 1000] | None = None
    """PERSISTENT_2 only: MB/s per TiB of storage."""
    availability_zone: AvailabilityZone | None = None
    """Default: the zone of the first node group; must be a zone a node group runs in."""
    mount_path: Annotated[str, AfterValidator(_check_absolute_path)] = "/fsx"
    """Where nodes mount it: the data prefix at <mount_path>/data, checkpoints at .../checkpoints."""


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
    mount_path: Annotated[str, AfterValidator(_check_absolute_path)] | None = None
    """Where `mount` mounts the bucket (default /data/<name>)."""
    fsx: FsxConfig | None = None
    """FSx for Lustre linked to the bucket (with access: fsx)."""
    noncurrent_version_expiration_days: Annotated[int, _in_range(1, 3650)] = 30
    """Created buckets: old versions under checkpoint_prefix expire after this; current ones never do."""


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


class AutoStopConfig(StrictModel):
    enabled: bool = True
    """Create the idle alarms, schedules and the auto-stop Lambda."""
    idle_minutes: Annotated[int, _in_range(5, 1440)] = 60
    """GPU utilisation must stay below the threshold this long before a group is stopped."""
    gpu_utilization_threshold_percent: Annotated[float, _in_range(1, 100)] = 5
    """Idle when even the group's busiest GPU stays below this (CloudWatch Maximum)."""
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
    autostop: AutoStopConfig = AutoStopConfig(enabled=False)
    """Idle stop, schedules, maximum lifetime and the pre-stop hook (off when absent)."""
    spot: SpotConfig = SpotConfig()
    """The spot-interruption hook."""


class StackSpec(StackConfig):
    """A validated stack: its config plus the stack name, project and region."""

    stack: str
    project: str = PROJECT
    region: Region

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
        """Tags for every resource: cost tags, extra tags and the stack identity."""
        return {
            **self.cluster.extra_tags,
            "owner": self.cluster.tags.owner,
            "cost_center": self.cluster.tags.cost_center,
            "environment": self.cluster.tags.environment,
            "gpucluster:stack": self.stack,
            "gpucluster:cluster": self.cluster.name,
        }


# ------------------------------------------------------------- cross-field checks

Check = Callable[[StackSpec], Iterable[Finding]]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    """Register a cross-field check; each is small, named, and reports all it finds."""
    CHECKS.append(fn)
    return fn


@check
def zones_in_region(spec: StackSpec) -> Iterable[Finding]:
    yield from zone_region_findings(spec.network.availability_zones, spec.region)


def zone_region_findings(zones: Sequence[str], region: str, path: str = "network.availability_zones",
                         region_key: str = REGION_KEY) -> Iterable[Finding]:
    """Every zone lies in the region."""
    for i, az in enumerate(zones):
        if not az.startswith(region) or len(az) != len(region) + 1:
            yield Finding(f"{path}[{i}]", f"{az!r} is not a zone of region {region!r} ({region_key})")


@check
def network_source(spec: StackSpec) -> Iterable[Finding]:
    yield from network_findings(spec.network)


def network_findings(net: NetworkConfig, path: str = "network",
                     subnets_key: str = "existing_subnets") -> Iterable[Finding]:
    """A created or an existing VPC, and for an existing one a subnet in each zone, no more."""
    subnets = join_path(path, subnets_key)
    zones = join_path(path, "availability_zones")
    if (net.vpc_cidr is None) == (net.existing_vpc_id is None):
        yield Finding(path or "existing_vpc_id",
                      "set exactly one of vpc_cidr (create a VPC) or existing_vpc_id")
    if net.existing_vpc_id:
        for az in net.availability_zones:
            if az not in net.existing_subnets:
                yield Finding(subnets, f"no subnet given for availability zone {az!r}")
        for az in net.existing_subnets:
            if az not in net.availability_zones:
                yield Finding(f"{subnets}.{az}", f"zone is not listed in {zones}")
    elif net.existing_subnets:
        yield Finding(subnets, "only used with existing_vpc_id")


def join_path(prefix: str, key: str) -> str:
    """`network` + `vpc_cidr` -> `network.vpc_cidr`; an empty prefix gives the key alone."""
    return f"{prefix}.{key}" if prefix else key


@check
def node_group_names_unique(spec: StackSpec) -> Iterable[Finding]:
    yield from unique_name_findings([g.name for g in spec.node_groups], "node_groups", "node group")


def unique_name_findings(names: Sequence[str], path: str, what: str) -> Iterable[Finding]:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            yield Finding(f"{path}[{i}].name", f"duplicate {what} name {name!r}")
        seen.add(name)


# Per-group rules: each takes one group, the zones it runs in (None where they are not known,
# e.g. a GpuNodeGroup handed subnet ids that are Outputs) and the key path of the group.
GroupCheck = Callable[[NodeGroupConfig, "Sequence[str] | None", str], Iterable[Finding]]
GROUP_CHECKS: list[GroupCheck] = []


def group_check(fn: GroupCheck) -> GroupCheck:
    """Register a per-group rule; the stack checks below run it on every node group."""
    GROUP_CHECKS.append(fn)
    return fn


def node_group_findings(group: NodeGroupConfig, zones: Sequence[str] | None,
                        path: str = "node_group") -> list[Finding]:
    """Every per-group rule on one group alone (a GpuNodeGroup's own args)."""
    return [f for rule in GROUP_CHECKS for f in rule(group, zones, path)]


def _each_group(spec: StackSpec, rule: GroupCheck) -> Iterable[Finding]:
    for i, g in enumerate(spec.node_groups):
        yield from rule(g, spec.azs_of(g), f"node_groups[{i}]")


@group_check
def group_counts(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    if not g.min_nodes <= g.desired_nodes <= g.max_nodes:
        yield Finding(path, f"need min_nodes <= desired_nodes <= max_nodes, got "
                      f"{g.min_nodes} <= {g.desired_nodes} <= {g.max_nodes}")
    if g.capacity.on_demand_base > g.max_nodes:
        yield Finding(f"{path}.capacity.on_demand_base",
                      f"must be <= max_nodes ({g.max_nodes}), got {g.capacity.on_demand_base}")


@check
def node_counts(spec: StackSpec) -> Iterable[Finding]:
    yield from _each_group(spec, group_counts)


@check
def node_group_zones(spec: StackSpec) -> Iterable[Finding]:
    for i, g in enumerate(spec.node_groups):
        yield from group_zone_findings(g.availability_zones or [], spec.network.availability_zones,
                                       f"node_groups[{i}]")


def group_zone_findings(group_zones: Sequence[str], network_zones: Sequence[str], path: str,
                        network_key: str = "network.availability_zones") -> Iterable[Finding]:
    """A group runs only in zones the network has."""
    for j, az in enumerate(group_zones):
        if az not in network_zones:
            yield Finding(f"{path}.availability_zones[{j}]", f"{az!r} is not in {network_key}")


@group_check
def group_efa(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """EFA on: every type supports it, all share one NIC layout, one zone, one subnet."""
    if g.efa == "on":
        for j, t in enumerate(g.types):
            if not t.supports_efa:
                yield Finding(f"{path}.instance_types[{j}]",
                              f"{t.name} does not support EFA (efa: on); use efa: off or an "
                              "EFA-capable type")
    if g.efa_enabled:
        layouts = {(t.network_cards, t.efa_interface_count) for t in g.types}
        if len(layouts) > 1:
            yield Finding(f"{path}.instance_types",
                          "EFA groups share one launch template, so every type needs the same "
                          "network cards and EFA interfaces; got " + ", ".join(
                              f"{t.name}={t.efa_interface_count}" for t in g.types))
    yield from single_zone_findings(g.efa_enabled, bool(g.placement_group), zones, path)


def single_zone_findings(efa: bool, placement_group: bool, zones: Sequence[str] | None,
                         path: str) -> Iterable[Finding]:
    """EFA and cluster placement groups live in one availability zone (and one subnet)."""
    if zones is None:
        return
    if efa and len(zones) != 1:
        yield Finding(f"{path}.availability_zones",
                      "EFA needs exactly one availability zone and subnet (cluster "
                      f"placement group); got {len(zones)}")
    if placement_group and len(zones) != 1:
        yield Finding(f"{path}.placement_group",
                      "a cluster placement group lives in one availability zone; "
                      f"the group has {len(zones)}")


@check
def efa_support(spec: StackSpec) -> Iterable[Finding]:
    yield from _each_group(spec, group_efa)


def _zones_text(zones: Sequence[str]) -> str:
    return ", ".join(zones) if zones else "none"


@group_check
def group_offered(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """The first type is offered in every zone of the group (error); each fallback too (warning).

    From catalog/data/offerings.yaml (AWS DescribeInstanceTypeOfferings as moto ships it): an ASG
    whose type is not offered in its zone never launches a node. A region the file does not
    cover is not checked; `gpucluster doctor` asks the account itself.
    """
    if not zones:
        return
    _, as_of = catalog.offerings_source()
    for j, name in enumerate(g.instance_types):
        missing = {az: offered for az in zones if isinstance(az, str) and ZONE_NAME.fullmatch(az)
                   and (offered := catalog.offered_zones(name, az[:-1])) is not None and az not in offered}
        if not missing:
            continue
        region = next(iter(missing))[:-1]
        offered = catalog.offered_zones(name, region) or []
        where = (f"in {region} it is offered in {_zones_text(offered)}" if offered else
                 f"no zone of {region} offers it (offered in: "
                 f"{_zones_text([z for zs in catalog.offered_anywhere(name).values() for z in zs])})")
        if j == 0:
            yield Finding(f"{path}.instance_types[0]", f"{name} is not offered in {', '.join(missing)}; "
                          f"{where} (EC2 instance type offerings as of {as_of})")
        else:
            yield Finding(f"{path}.instance_types[{j}]", f"fallback {name} is not offered in "
                          f"{', '.join(missing)}, so the group never launches it there; {where}",
                          level="warning")


@check
def offered_in_zone(spec: StackSpec) -> Iterable[Finding]:
    yield from _each_group(spec, group_offered)


@group_check
def group_efa_spot(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """A multi-node EFA group that can hold spot nodes: one interruption stalls every rank (warning)."""
    cap = g.capacity
    if g.efa_enabled and g.max_nodes > 1 and cap.market == "mixed" and cap.spot_percent > 0 \
            and g.max_nodes > cap.on_demand_base:
        yield Finding(f"{path}.capacity.spot_percent",
                      f"a multi-node EFA group holds spot nodes ({_num(cap.spot_percent)} % above the "
                      "base): one reclaimed node stops the whole collective job, and its replacement "
                      "is not placed near the others; run multi-node EFA training on-demand or on a "
                      "Capacity Block, and single-node work on spot in a group of its own",
                      level="warning")


@check
def efa_spot(spec: StackSpec) -> Iterable[Finding]:
    yield from _each_group(spec, group_efa_spot)


@group_check
def group_capacity(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    cap, cap_path = g.capacity, f"{path}.capacity"
    if cap.market == "capacity_block":
        if cap.capacity_reservation_id is None:
            yield Finding(f"{cap_path}.capacity_reservation_id",
                          "a capacity block needs its reservation id (cr-...)")
        if cap.spot_percent:
            yield Finding(f"{cap_path}.spot_percent",
                          f"capacity blocks have no spot share; must be 0, got {_num(cap.spot_percent)}")
        if len(g.instance_types) != 1:
            yield Finding(f"{path}.instance_types",
                          "a capacity block is for exactly one instance type, got "
                          f"{len(g.instance_types)}")
        for j, t in enumerate(g.types):
            if not t.family.capacity_blocks:
                yield Finding(f"{path}.instance_types[{j}]",
                              f"{t.name} cannot be bought as a Capacity Block for ML")
    elif not float(cap.spot_percent).is_integer():
        yield Finding(f"{cap_path}.spot_percent", "Auto Scaling splits on-demand and spot in whole "
                      f"percent; use a whole number, got {_num(cap.spot_percent)}")
    if cap.market == "mixed" and cap.capacity_reservation_id and cap.on_demand_base == 0 \
            and cap.spot_percent == 100:
        yield Finding(f"{cap_path}.capacity_reservation_id", "a capacity reservation serves "
                      "on-demand nodes, but on_demand_base is 0 and spot_percent is 100")
    if cap.capacity_reservation_id and zones is not None and len(zones) != 1:
        yield Finding(f"{path}.availability_zones", "a capacity reservation lives in "
                      "one availability zone; give the group exactly one (the reservation's)")
    if cap.base_commitment != "none" and cap.on_demand_base == 0:
        yield Finding(f"{cap_path}.base_commitment",
                      f"{cap.base_commitment} covers the on-demand base, but on_demand_base is 0")


@check
def capacity_rules(spec: StackSpec) -> Iterable[Finding]:
    yield from _each_group(spec, group_capacity)


@group_check
def group_ami(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    if g.ami_id and g.ami_ssm_parameter:
        yield Finding(f"{path}.ami_id", "set ami_id or ami_ssm_parameter, not both")


@check
def ami_override(spec: StackSpec) -> Iterable[Finding]:
    yield from _each_group(spec, group_ami)


@check
def datasets(spec: StackSpec) -> Iterable[Finding]:
    names: set[str] = set()
    buckets: set[str] = set()
    for i, d in enumerate(spec.datasets):
        path = f"datasets[{i}]"
        if d.name in names:
            yield Finding(f"{path}.name", f"duplicate dataset name {d.name!r}")
        names.add(d.name)
        if d.bucket_name:
            if d.bucket_name in buckets:
                yield Finding(f"{path}.bucket_name", f"bucket {d.bucket_name!r} is used twice")
            buckets.add(d.bucket_name)
        yield from dataset_findings(d, spec.cluster.name, spec.node_group_zones, path)


def dataset_findings(d: DatasetConfig, cluster_name: str, node_group_zones: set[str] | None,
                     path: str = "dataset") -> Iterable[Finding]:
    """Every rule on one dataset alone; `node_group_zones` None where the node groups are not known."""
    if d.existing and not d.bucket_name:
        yield Finding(f"{path}.bucket_name", "required for an existing bucket")
    if not d.existing and not d.bucket_name:
        generated = generated_bucket_prefix(cluster_name, d.name)
        if generated.startswith(BUCKET_RESERVED_PREFIXES):
            yield Finding(f"{path}.bucket_name", f"the generated bucket name would start with "
                          f"{generated!r}, a prefix S3 reserves; set a bucket_name")
    if d.access == "fsx" and d.fsx is None:
        yield Finding(f"{path}.fsx", "required when access is fsx")
    if d.fsx is not None:
        if d.access != "fsx":
            yield Finding(f"{path}.fsx", f"only used with access: fsx, got access: {d.access}")
        yield from _fsx_rules(d, node_group_zones, path)
    if d.mount_path and d.access != "mount":
        yield Finding(f"{path}.mount_path", f"only used with access: mount, got {d.access}")
    yield from _checkpoint_rules(d, path)


def _checkpoint_rules(d: DatasetConfig, path: str) -> Iterable[Finding]:
    if d.checkpoint_prefix == "":
        yield Finding(f"{path}.checkpoint_prefix", "must be a folder-like prefix such as "
                      "'checkpoints/', not the whole bucket (nodes get write access to it)")
    elif d.checkpoint_prefix is not None and d.prefix and (
            d.checkpoint_prefix.startswith(d.prefix) or d.prefix.startswith(d.checkpoint_prefix)):
        yield Finding(f"{path}.checkpoint_prefix", "must not overlap the read-only data "
                      f"prefix {d.prefix!r}, got {d.checkpoint_prefix!r}")
    if "noncurrent_version_expiration_days" in d.model_fields_set:
        if d.existing:
            yield Finding(f"{path}.noncurrent_version_expiration_days", "only applies to buckets "
                          "this stack creates; an existing bucket's lifecycle is never changed")
        elif d.checkpoint_prefix is None:
            yield Finding(f"{path}.noncurrent_version_expiration_days",
                          "only used with a checkpoint_prefix (the lifecycle rule covers it alone)")


def _fsx_rules(d: DatasetConfig, node_group_zones: set[str] | None, dataset: str) -> Iterable[Finding]:
    fsx, path = d.fsx, f"{dataset}.fsx"
    if fsx is None:
        return
    size = fsx.storage_capacity_gib
    # FSx API reference, CreateFileSystem StorageCapacity: SCRATCH_2 and PERSISTENT_2 (SSD)
    # take 1200 GiB, 2400 GiB and increments of 2400 GiB.
    if size != 1200 and size % 2400:
        yield Finding(f"{path}.storage_capacity_gib",
                      f"FSx for Lustre takes 1200 or a multiple of 2400 GiB, got {size}")
    if fsx.deployment_type == "PERSISTENT_2" and fsx.throughput_per_unit_mib is None:
        yield Finding(f"{path}.throughput_per_unit_mib",
                      "required for PERSISTENT_2 (125, 250, 500 or 1000)")
    if fsx.deployment_type == "SCRATCH_2" and fsx.throughput_per_unit_mib is not None:
        yield Finding(f"{path}.throughput_per_unit_mib",
                      "SCRATCH_2 has a fixed throughput; only PERSISTENT_2 takes this")
    if fsx.availability_zone and node_group_zones is not None \
            and fsx.availability_zone not in node_group_zones:
        yield Finding(f"{path}.availability_zone", f"no node group runs in "
                      f"{fsx.availability_zone!r} (node groups use "
                      f"{', '.join(sorted(node_group_zones))})")
    if d.checkpoint_prefix and not d.prefix:
        # The data association would link the whole bucket, checkpoints included: what the
        # checkpoint association exports would come back as a second copy under /data.
        yield Finding(f"{dataset}.prefix",
                      "an FSx dataset with a checkpoint_prefix needs a data prefix of its own "
                      "(e.g. 'data/'), so the two data repository associations do not overlap")


@check
def dataset_paths(spec: StackSpec) -> Iterable[Finding]:
    """Where datasets appear on a node: one place each, never inside the NVMe scratch mount."""
    scratch = {g.scratch_mount.rstrip("/") for g in spec.node_groups}
    seen: dict[str, str] = {}
    for i, d in enumerate(spec.datasets):
        key = {"mount": "mount_path", "fsx": "fsx.mount_path"}.get(d.access)
        if key is None:
            if len(scratch) > 1:
                yield Finding(f"datasets[{i}].access", "copy_to_scratch needs one scratch_mount "
                              f"for every node group, got {', '.join(sorted(scratch))}")
            continue
        where = dataset_path(spec, d)
        yield from data_path_findings(where, f"datasets[{i}].{key}", scratch, seen)
        seen[d.name] = where


def data_path_findings(where: str, path: str, scratch_mounts: Iterable[str],
                       others: Mapping[str, str]) -> Iterable[Finding]:
    """A dataset's place on the node overlaps neither NVMe scratch nor another dataset (name -> path)."""
    for mount in sorted(scratch_mounts):
        if _nested(where, mount):
            yield Finding(path, f"{where} overlaps the NVMe scratch mount "
                          f"{mount}, which is erased and reformatted at boot")
    for other, other_path in others.items():
        if _nested(where, other_path):
            yield Finding(path, f"{where} overlaps {other_path} of dataset {other!r}")


def _nested(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def dataset_path(spec: StackSpec, d: DatasetConfig) -> str:
    """Where a dataset appears on every node (copy: under scratch; mount; FSx mount path)."""
    if d.access == "fsx" and d.fsx is not None:
        return d.fsx.mount_path
    if d.access == "mount":
        return d.mount_path or f"/data/{d.name}"
    return f"{spec.node_groups[0].scratch_mount.rstrip('/')}/{d.name}"


@check
def budget_rules(spec: StackSpec) -> Iterable[Finding]:
    if spec.budget is not None:
        yield from budget_findings(spec.budget)


def budget_findings(b: BudgetConfig, path: str = "budget") -> Iterable[Finding]:
    t = b.alert_thresholds_percent
    if any(later <= earlier for earlier, later in pairwise(t)):
        yield Finding(f"{path}.alert_thresholds_percent",
                      f"must be strictly ascending, got {', '.join(_num(x) for x in t)}")
    # One ACTUAL notification per distinct threshold plus the FORECASTED one at 100 %;
    # a budget holds at most 10 notifications (Budgets API reference, "Notification").
    actual = set(t) | ({b.action_threshold_percent} if b.action_threshold_percent else set())
    if len(actual) + 1 > MAX_BUDGET_NOTIFICATIONS:
        yield Finding(f"{path}.alert_thresholds_percent",
                      f"AWS Budgets allows {MAX_BUDGET_NOTIFICATIONS} notifications per budget: "
                      f"{len(actual)} actual-spend thresholds (with action_threshold_percent) and the "
                      f"forecast alert make {len(actual) + 1}")


@check
def autostop_rules(spec: StackSpec) -> Iterable[Finding]:
    yield from autostop_findings(spec.autostop)


def autostop_findings(a: AutoStopConfig, path: str = "autostop") -> Iterable[Finding]:
    if a.start_schedule and not a.stop_schedule:
        yield Finding(f"{path}.start_schedule", "needs a stop_schedule to undo")
    if a.start_schedule and a.start_schedule == a.stop_schedule:
        yield Finding(f"{path}.start_schedule", "is the same as stop_schedule")


# ----------------------------------------------------------------------- parsing


def _describe(model: type[BaseModel] | None, loc: tuple[str | int, ...]) -> list[str]:
    """Field names of the model found at `loc` inside `model`, for did-you-mean hints."""
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        model = model_in(field.annotation)
    return list(model.model_fields) if model else []


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`X`, `X | None`, `list[X]`, `Annotated[X, ...]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = model_in(arg)
        if found:
            return found
    return None


def format_path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: Mapping[str, Any], root: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "extra_forbidden":
        known = _describe(root, loc[:-1])
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        tail = f"did you mean {hint[0]!r}?" if hint else f"known keys: {', '.join(known)}"
        return f"unknown key; {tail}"
    if kind == "missing":
        return "required key is missing"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {value!r}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"must be a whole number, got {value!r}"
    if kind in ("float_parsing", "float_type"):
        return f"must be a number, got {value!r}"
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false, got {value!r}"
    if kind == "string_type":
        return f"must be a string, got {value!r}"
    if kind == "list_type":
        return f"must be a list, got {type(value).__name__}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping of keys, got {type(value).__name__}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    if kind == "too_long":
        return f"allows at most {ctx.get('max_length')} item(s), got {ctx.get('actual_length')}"
    return str(error["msg"])


def _findings_from(exc: ValidationError, root: type[BaseModel],
                   prefix: tuple[str | int, ...] = ()) -> list[Finding]:
    findings = []
    for error in exc.errors():
        # a dict key's own error carries a trailing "[key]" marker after the key
        loc = tuple(p for p in error["loc"] if p != "[key]")
        findings.append(Finding(format_path(prefix + loc), _message(error, root, loc)))
    return findings


def validation_findings(exc: ValidationError, root: type[BaseModel] | None = None,
                        prefix: tuple[str | int, ...] = ()) -> list[Finding]:
    """A pydantic error as findings worded like the stack file's (component Args are checked with it)."""
    return _findings_from(exc, root, prefix)  # type: ignore[arg-type]


def _decode(value: Any) -> Any:
    """Pulumi hands structured config over as JSON text; plain YAML gives objects."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def parse_stack_config(config: Mapping[str, Any], stack: str) -> StackSpec:
    """Validate a stack's config map (`project:key` -> value) into a StackSpec.

    Raises SpecError with every problem found: unknown or missing keys, bad
    values and all cross-field rules.
    """
    findings: list[Finding] = []
    values: dict[str, Any] = {}
    known = list(StackConfig.model_fields)
    for key, value in config.items():
        namespace, _, name = key.rpartition(":")
        if namespace not in ("", PROJECT):
            continue
        if name not in known:
            hint = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            tail = f"did you mean '{PROJECT}:{hint[0]}'?" if hint else f"known: {', '.join(known)}"
            findings.append(Finding(f"{PROJECT}:{name}", f"unknown key; {tail}"))
            continue
        values[name] = _decode(value)
    region = config.get(REGION_KEY)
    if region is None:
        findings.append(Finding(REGION_KEY, "required key is missing (e.g. us-east-1)"))
    try:
        spec = StackSpec.model_validate({**values, "stack": stack, "region": region or "us-east-1"})
    except ValidationError as exc:
        for finding in _findings_from(exc, StackSpec):
            path = REGION_KEY if finding.path == "region" else finding.path
            findings.append(Finding(path, finding.message))
        raise SpecError(findings) from None
    for rule in CHECKS:
        findings.extend(f for f in rule(spec) if f.level == "error")
    if findings:
        raise SpecError(findings)
    return spec


def stack_warnings(spec: StackSpec) -> list[Finding]:
    """The warning-level findings of every check on a valid spec (what `plan` prints)."""
    return [f for rule in CHECKS for f in rule(spec) if f.level == "warning"]
