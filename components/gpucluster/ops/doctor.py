"""Pre-flight checks of a stack against the AWS account it will be deployed to, read-only.

It owns the questions a deploy would otherwise answer by failing half-way, or not at all: is
each instance type offered in the group's zones, do the EFA limits match the catalog the launch
templates are built from, are the capacity reservations there, active, unexpired and of the
right zone and type, do the account's vCPU quotas cover max nodes, is the cost-allocation tag
the budget filters on active (else the budget sees $0 and never stops anything), and does any
Auto Scaling group in the region carry this deployment's identity without being one of its
groups (else the guardrails of two deployments act on each other's groups), and which operating
system each node group's and the login nodes' AMI boots (the node scripts run on Ubuntu 22.04/24.04
and Amazon Linux 2023 only). It also fetches live spot prices for `gpucluster cost --live`.
Every check returns findings with a level (ok, warning, blocker) and reports all it finds.
It only calls Describe/Get/List APIs, never creates or changes anything, and builds its
clients through `ops.Clients` (in the stack's region), so `AWS_ENDPOINT_URL` works.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from gpucluster import catalog
from gpucluster.fleet.awsapi import group_tags, stack_groups
from gpucluster.fleet.tags import NODE_GROUP_TAG
from gpucluster.ops import Clients, OpsError, make_client
from gpucluster.ops.amis import SUPPORTED, AmiFacts, describe_amis, os_of
from gpucluster.ops.awserrors import describe, from_parser, looks_like_markup
from gpucluster.ops.capacity import WARNING_BEFORE_END as BLOCK_WARNING_BEFORE_END
from gpucluster.pricing import Rate, split_nodes
from gpucluster.spec import STACK_TAG, NodeGroupConfig, StackSpec
from gpucluster.spec.models import baked_image, launches_baked

Level = Literal["ok", "warning", "blocker"]

# EC2 vCPU quotas by instance class (Service Quotas, service code `ec2`).
QUOTAS: dict[tuple[str, str], tuple[str, str]] = {
    ("P", "on-demand"): ("L-417A185B", "Running On-Demand P instances"),
    ("G", "on-demand"): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("P", "spot"): ("L-7212CCBC", "All P Spot Instance Requests"),
    ("G", "spot"): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
}
# The tags the budget can filter on: the deployment's identity and the cost centre (spec.tags).
# The budget's own filter is the identity (aws/guardrail_budget.py `tag_cost_filter`).
COST_TAGS = (STACK_TAG, "cost_center")
RESERVATION_SOON = timedelta(days=7)
# Every API doctor calls, as IAM actions: read-only, none with resource-level permissions. The deploy
# roles hold them (infra/bootstrap-state), so the deploy workflow's doctor gate can run.
IAM_ACTIONS = ("ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes",
               "ec2:DescribeCapacityReservations", "ec2:DescribeImages", "servicequotas:GetServiceQuota",
               "servicequotas:GetAWSDefaultServiceQuota", "ce:ListCostAllocationTags",
               "autoscaling:DescribeAutoScalingGroups")
# Asked only for a stack that names a permissions boundary or a break-glass role (check_iam_names);
# without them that check is a warning ("could not check"), never a crash, so the deploy gate holds.
IAM_NAME_ACTIONS = ("sts:GetCallerIdentity", "iam:GetPolicy", "iam:GetRole")
# Asked only of an EKS stack (check_eks): read-only, answered before the cluster exists.
EKS_ACTIONS = ("eks:DescribeClusterVersions", "eks:DescribeCluster")
# The node group a group belongs to (gpucluster.aws.nodes.NODE_GROUP_TAG; not imported: Pulumi).
ACTIVATE_TAG = ("activate it in the paying account (the Organization's management account): Billing > "
                "Cost allocation tags, or `aws ce update-cost-allocation-tags-status "
                "--cost-allocation-tags-status TagKey={key},Status=Active`")
# A Capacity Block ends at a fixed time and takes its instances with it: a day's notice.
BLOCK_ENDS_SOON = timedelta(days=1)
# Reservation states before capacity is usable (EC2 API, CapacityReservation.State): a purchased
# block is payment-pending, then scheduled until its start; a future-dated reservation is scheduled.
NOT_STARTED = frozenset({"payment-pending", "scheduled", "assessing", "delayed"})


@dataclass(frozen=True)
class DoctorFinding:
    level: Level
    check: str
    subject: str
    message: str


class DoctorError(OpsError):
    """AWS cannot be asked at all (no credentials, no endpoint): nothing was checked."""


def check_iam_names(spec: StackSpec, iam: Any, sts: Any) -> Iterable[DoctorFinding]:
    """The permissions boundary and the break-glass role the stack names exist in this account.

    Neither is created by the stack: the boundary by infra/bootstrap-state (`gpucluster init
    --hardened` ships the script), the break-glass role by the account's administrators. A missing
    boundary blocks: IAM refuses to create a role with a boundary that does not exist (IAM API
    reference, CreateRole: PermissionsBoundary must be an existing managed policy's ARN), so
    `pulumi up` fails half-way. A missing break-glass role only warns: the bucket policies name it
    in a condition (aws:PrincipalArn), which IAM does not resolve, so the deploy succeeds but nobody
    can delete old dataset versions or buckets until the role exists.
    """
    boundary, role = spec.cluster.permissions_boundary, spec.cluster.break_glass_role
    if boundary is None and role is None:
        return
    caller = ""
    if boundary is not None:
        try:
            caller = str(sts.get_caller_identity()["Arn"])
        except ClientError as err:
            yield _not_checked("boundary", boundary, err)
    if boundary is not None and caller:
        partition, account = caller.split(":")[1], caller.split(":")[4]
        arn = f"arn:{partition}:iam::{account}:policy/{boundary}"
        try:
            iam.get_policy(PolicyArn=arn)
            yield DoctorFinding("ok", "boundary", boundary, f"{arn} exists")
        except ClientError as err:
            if _error_code(err) != "NoSuchEntity":
                yield _not_checked("boundary", boundary, err)
            else:
                yield DoctorFinding("blocker", "boundary", boundary, (
                    f"gpucluster:cluster.permissions_boundary: {arn} does not exist, so IAM refuses "
                    "every role the stack creates; run the bootstrap script first (infra/bootstrap-state/"
                    "bootstrap_state.py; `gpucluster init --hardened` ships it), or remove the key"))
    if role is not None:
        try:
            iam.get_role(RoleName=role)
            yield DoctorFinding("ok", "break-glass", role, "the role exists")
        except ClientError as err:
            if _error_code(err) != "NoSuchEntity":
                yield _not_checked("break-glass", role, err)
            else:
                yield DoctorFinding("warning", "break-glass", role, (
                    f"gpucluster:cluster.break_glass_role: no role {role} in this account: the stack "
                    "deploys, but nobody can delete old dataset versions or the buckets until an "
                    "administrator creates it (or the key names an existing role)"))


def _error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", "error"))


def _not_checked(check: str, subject: str, err: ClientError) -> DoctorFinding:
    """A check AWS did not answer: a warning with its error code, or, for an answer with no AWS
    error code (an HTML page from a proxy, a bare 5xx), its HTTP status; never the page itself."""
    code = str(err.response.get("Error", {}).get("Code") or "")
    message = " ".join(str(err.response.get("Error", {}).get("Message", "")).split())
    status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or code or "?"
    if not code or code.isdigit() or looks_like_markup(message):
        detail = f"HTTP {status} with no AWS error code: not an AWS answer"
    else:
        detail = f"{code}: {message}" if message else code
    return DoctorFinding("warning", check, subject, f"could not check ({detail})")


# ----------------------------------------------------------------------- checks

DEFAULT_IMAGE = "the default Deep Learning AMI (Ubuntu 22.04)"
"""The image a group or the login nodes boot with no AMI named (gpucluster.aws.nodes.DEFAULT_AMI_PARAMETER,
gpucluster.aws.pcs.DEFAULT_LOGIN_AMI_PARAMETER: the Ubuntu 22.04 DLAMI; not imported: Pulumi)."""
SUPPORTED_LINE = ", ".join(SUPPORTED)


def stack_images(spec: StackSpec) -> dict[str, str | None]:
    """The AMI each node group boots (and on a Slurm stack the login nodes, `login`), as the launch
    templates take it: a pinned baked image, the group's ami_id, scheduler.ami_id; None: an SSM
    parameter's image (the group's ami_ssm_parameter or the default), resolved at deploy."""
    slurm = spec.scheduler.slurm
    images: dict[str, str | None] = {}
    for group in spec.node_groups:
        baked = baked_image(spec.images, group)
        images[group.name] = ((baked.ami_id if baked is not None and launches_baked(spec.images, group)
                               else None) or group.ami_id or (spec.scheduler.ami_id if slurm else None))
    if slurm:
        images["login"] = spec.scheduler.ami_id
    return images


def check_amis(spec: StackSpec, ec2: Any) -> Iterable[DoctorFinding]:
    """Which operating system each image boots (DescribeImages: name, description, platform details,
    root device) and whether gpucluster's node scripts run on it: an unsupported one blocks (every node
    would stop at boot with one FAILED line), one whose name does not tell warns."""
    images = stack_images(spec)
    ids = sorted({i for i in images.values() if i is not None})
    try:
        facts = describe_amis(ec2, ids) if ids else {}
    except ClientError as err:
        yield _not_checked("ami", ", ".join(ids), err)
        return
    for subject, image_id in images.items():
        if image_id is None:
            group = next((g for g in spec.node_groups if g.name == subject), None)
            yield _parameter_finding(subject, group.ami_ssm_parameter if group is not None else None)
        elif image_id not in facts:
            yield DoctorFinding("blocker", "ami", subject, f"{image_id}: no such image in {spec.region} for "
                                "this account (deregistered, another region, or not shared with it)")
        else:
            yield from _ami_findings(spec, subject, facts[image_id])


def _parameter_finding(subject: str, parameter: str | None) -> DoctorFinding:
    """An image named by an SSM parameter (resolved at deploy): what its name says."""
    if parameter is None:
        return DoctorFinding("ok", "ami", subject, f"{DEFAULT_IMAGE}: supported; jobs run as ubuntu")
    system = os_of(parameter)
    if system in SUPPORTED:
        return DoctorFinding("ok", "ami", subject, f"SSM parameter {parameter} names {system}: supported")
    return DoctorFinding("warning", "ami", subject, f"SSM parameter {parameter}: "
                         + (f"names {system}; " if system else "its name names no operating system; ")
                         + f"gpucluster's node scripts run on {SUPPORTED_LINE} and stop the boot on any "
                         "other (check the image: `aws ec2 describe-images --image-ids <id>`)")


def _ami_findings(spec: StackSpec, subject: str, ami: AmiFacts) -> Iterable[DoctorFinding]:
    what = (f"{ami.image_id} ({ami.name or 'no name'}; {ami.platform_details or '?'}; "
            f"root {ami.root_device_name})")
    if ami.supported:
        yield DoctorFinding("ok", "ami", subject, f"{what} boots {ami.os}: supported; jobs run as "
                            f"{ami.job_user}")
        p = spec.observability.prometheus
        # (not on EKS: there the cluster's charts collect, not the nodes)
        if (ami.os == "Amazon Linux 2023" and p.active and not p.containers and subject != "login"
                and not spec.scheduler.eks):
            yield DoctorFinding("warning", "ami", subject, "observability.prometheus: Amazon Linux 2023 has "
                                "no Prometheus package, so these nodes send no metrics to AMP until "
                                "observability.prometheus.prometheus_image and "
                                "observability.prometheus.node_exporter_image are set (pinned by digest: "
                                "run as containers); jobs, the CloudWatch agent and the idle stop are not "
                                "affected")
    elif ami.os is not None:
        yield DoctorFinding("blocker", "ami", subject, f"{what} boots {ami.os}: gpucluster's node scripts "
                            f"run on {SUPPORTED_LINE}; every node would stop at boot with one FAILED line")
    else:
        yield DoctorFinding("warning", "ami", subject, f"{what}: its name and description name no operating "
                            f"system; gpucluster's node scripts run on {SUPPORTED_LINE} and a node on any "
                            "other stops at boot with one FAILED line")


def eks_version_finding(spec: StackSpec, version: str, eks: Any) -> DoctorFinding:
    """What DescribeClusterVersions says of `version` in the stack's region."""
    try:
        found = eks.describe_cluster_versions(clusterVersions=[version]).get("clusterVersions", [])
    except ClientError as err:
        return _not_checked("eks-version", version, err)
    status = next((str(v.get("versionStatus") or "") for v in found if v.get("clusterVersion") == version),
                  "UNSUPPORTED")
    if status == "STANDARD_SUPPORT":
        return DoctorFinding("ok", "eks-version", version, "in standard support")
    if status == "EXTENDED_SUPPORT":
        return DoctorFinding("warning", "eks-version", version, (
            "in extended support only: EKS charges the extended-support price per cluster-hour; "
            "move scheduler.kubernetes_version to a version in standard support"))
    return DoctorFinding("blocker", "eks-version", version, (
        f"EKS does not offer Kubernetes {version} in {spec.region}: set scheduler.kubernetes_version "
        "to a supported version (`aws eks describe-cluster-versions`), or leave it out"))


def check_eks(spec: StackSpec, eks: Any) -> Iterable[DoctorFinding]:
    """An EKS stack: its Kubernetes version is one EKS supports in this region (DescribeClusterVersions'
    versionStatus: standard support, extended support at its higher price, or unsupported), and the caller
    may call DescribeCluster, which `run`, `jobs` and `verify` need (a name no cluster has answers
    ResourceNotFoundException only to a caller allowed to ask; ledger: eks-describe-authz)."""
    version = spec.scheduler.kubernetes_version
    if version is None:
        yield DoctorFinding("ok", "eks-version", "default",
                            "the catalog's newest version in standard support")
    else:
        yield eks_version_finding(spec, version, eks)
    from gpucluster.eks.naming import eks_cluster_name

    name = eks_cluster_name(spec.cluster.name, spec.identity)  # the name the stack gives its cluster
    try:
        eks.describe_cluster(name=name)
        yield DoctorFinding("ok", "eks-access", name, "may call eks:DescribeCluster")
    except ClientError as err:
        if _error_code(err) == "ResourceNotFoundException":
            yield DoctorFinding("ok", "eks-access", name, "may call eks:DescribeCluster")
        elif _error_code(err) in ("AccessDeniedException", "AccessDenied", "UnauthorizedOperation"):
            yield DoctorFinding("warning", "eks-access", name, (
                "may not call eks:DescribeCluster: `run`, `jobs`, `logs`, `cancel` and `verify` find the "
                "cluster with it; grant eks:ListClusters and eks:DescribeCluster"))
        else:
            yield _not_checked("eks-access", name, err)


def check_offerings(spec: StackSpec, ec2: Any) -> Iterable[DoctorFinding]:
    """Each type offered in each of its group's zones; a zone with no offered type blocks."""
    for group in spec.node_groups:
        zones = spec.azs_of(group)
        try:
            pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
                LocationType="availability-zone",
                Filters=[{"Name": "instance-type", "Values": list(group.instance_types)},
                         {"Name": "location", "Values": zones}])
            offered = {(o["InstanceType"], o["Location"]) for page in pages
                       for o in page["InstanceTypeOfferings"]}
        except ClientError as err:
            yield _not_checked("offering", group.name, err)
            continue
        for az in zones:
            missing = [t for t in group.instance_types if (t, az) not in offered]
            if len(missing) == len(group.instance_types):
                yield DoctorFinding("blocker", "offering", f"{group.name} {az}",
                                    f"{', '.join(missing)} not offered in {az}: the group cannot "
                                    "launch there; pick another zone or type")
            elif missing:
                yield DoctorFinding("warning", "offering", f"{group.name} {az}",
                                    f"fallback {', '.join(missing)} not offered in {az}; the group "
                                    "launches the other types only")
            else:
                yield DoctorFinding("ok", "offering", f"{group.name} {az}",
                                    f"{', '.join(group.instance_types)} offered")


def check_efa(spec: StackSpec, ec2: Any) -> Iterable[DoctorFinding]:
    """EFA and network-card limits as AWS reports them against the catalog (NIC layout)."""
    names = sorted({t for g in spec.node_groups for t in g.instance_types})
    efa_types = {t for g in spec.node_groups if g.efa_enabled for t in g.instance_types}
    try:
        pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=names)
        reported = {t["InstanceType"]: t for page in pages for t in page["InstanceTypes"]}
    except ClientError as err:
        yield _not_checked("efa", ", ".join(names), err)
        return
    for name in names:
        entry, aws = catalog.get(name), reported.get(name)
        assert entry is not None
        if aws is None:
            yield DoctorFinding("warning", "efa", name, "not described by DescribeInstanceTypes")
            continue
        net = aws.get("NetworkInfo", {})
        efa = net.get("EfaInfo", {}).get("MaximumEfaInterfaces", 0) if net.get("EfaSupported") else 0
        cards = net.get("MaximumNetworkCards", 1)
        if (efa, cards) == (entry.max_efa_interfaces, entry.network_cards):
            yield DoctorFinding("ok", "efa", name, f"{efa} EFA interfaces, {cards} network cards, as the "
                                "catalog says")
            continue
        # Fewer than the catalog: launch templates ask for NICs the instance lacks.
        level: Level = "blocker" if name in efa_types and (efa < entry.efa_interface_count
                                                          or cards < entry.network_cards) else "warning"
        yield DoctorFinding(level, "efa", name, f"AWS reports {efa} EFA interfaces / {cards} network "
                            f"cards, the catalog {entry.max_efa_interfaces} / {entry.network_cards}; "
                            "update components/gpucluster/catalog/data/instance_types.yaml")


def check_reservations(spec: StackSpec, ec2: Any, now: datetime | None = None) -> Iterable[DoctorFinding]:
    """Each capacity reservation exists, is active, unexpired, and of the group's zone and type."""
    now = now or datetime.now(UTC)
    for group in spec.node_groups:
        cr_id = group.capacity.capacity_reservation_id
        if cr_id is None:
            continue
        subject = f"{group.name} {cr_id}"
        try:
            found = ec2.describe_capacity_reservations(CapacityReservationIds=[cr_id])["CapacityReservations"]
        except ClientError as err:
            if _error_code(err).startswith("InvalidCapacityReservationId"):
                found = []
            else:
                yield _not_checked("reservation", subject, err)
                continue
        if not found:
            yield DoctorFinding("blocker", "reservation", subject, "no such capacity reservation in "
                                f"{spec.region} for this account")
            continue
        yield from _reservation_findings(spec, group, found[0], subject, now)


def _reservation_findings(spec: StackSpec, group: NodeGroupConfig, cr: dict[str, Any], subject: str,
                          now: datetime) -> Iterable[DoctorFinding]:
    problems: list[tuple[Level, str]] = []
    state, start, end = cr.get("State", "unknown"), cr.get("StartDate"), cr.get("EndDate")
    block = cr.get("ReservationType") == "capacity-block"
    if end is not None and end <= now:
        problems.append(("blocker", f"expired at {end:%Y-%m-%d %H:%M} UTC"))
    elif state in NOT_STARTED or (start is not None and start > now and state != "active"):
        kind = "a capacity block" if block else "a reservation"
        when = f"starts at {start:%Y-%m-%d %H:%M} UTC" if start else "has no start date yet"
        pending = " (payment pending)" if state == "payment-pending" else ""
        problems.append(("warning", f"{kind} that has not started{pending}: it {when}, in "
                         f"{_duration(start - now) if start else '?'}; nodes launch from then"))
    elif state != "active":
        problems.append(("blocker", f"state is {state}, not active"))
    elif block and end is not None and end - now < BLOCK_ENDS_SOON:
        minutes = int(BLOCK_WARNING_BEFORE_END.total_seconds() // 60)
        problems.append(("warning", f"ends at {end:%Y-%m-%d %H:%M} UTC, in {_duration(end - now)}: the "
                         f"block-expiry guardrail runs the pre-stop hook and scales the group to zero "
                         f"{minutes} minutes before; EC2 terminates the instances from 30 minutes before"))
    elif not block and end is not None and end - now < RESERVATION_SOON:
        problems.append(("warning", f"ends at {end:%Y-%m-%d %H:%M} UTC, within "
                         f"{RESERVATION_SOON.days} days"))
    zones = spec.azs_of(group)
    if cr.get("AvailabilityZone") not in zones:
        problems.append(("blocker", f"is in {cr.get('AvailabilityZone')}, the group runs in "
                         f"{', '.join(zones)}"))
    if cr.get("InstanceType") not in group.instance_types:
        problems.append(("blocker", f"is for {cr.get('InstanceType')}, the group launches "
                         f"{', '.join(group.instance_types)}"))
    market = group.capacity.market
    if block != (market == "capacity_block"):
        kind = "a capacity block" if block else "an on-demand capacity reservation"
        problems.append(("blocker", f"is {kind}, but capacity.market is {market}"))
    needed = group.max_nodes if market == "capacity_block" else group.capacity.on_demand_base
    total = cr.get("TotalInstanceCount", 0)
    if total < needed:
        problems.append(("warning", f"holds {total} instances, the group wants {needed} from it"))
    if not problems:
        yield DoctorFinding("ok", "reservation", subject, f"{state}, {cr.get('InstanceType')} x {total} in "
                            f"{cr.get('AvailabilityZone')}" + (f", until {end:%Y-%m-%d}" if end else ""))
    for level, message in problems:
        yield DoctorFinding(level, "reservation", subject, message)


def _duration(delta: timedelta) -> str:
    """3 days 4 h, 5 h 20 min, 12 min."""
    minutes = max(0, int(delta.total_seconds() // 60))
    days, rest = divmod(minutes, 24 * 60)
    hours, minutes = divmod(rest, 60)
    if days:
        return f"{days} day{'s' if days > 1 else ''} {hours} h"
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"


def quota_class(instance_type: str) -> str | None:
    """`P` or `G` (the EC2 vCPU quota class of the GPU families we carry), else None."""
    first = catalog.family_of(instance_type)[0]
    return first.upper() if first in "pg" else None


def vcpus_needed(spec: StackSpec) -> dict[tuple[str, str], int]:
    """vCPUs at max nodes per (class, on-demand|spot), each group at its largest type.

    Capacity-block groups are left out: their count is what the block holds (checked there).
    """
    need: dict[tuple[str, str], int] = defaultdict(int)
    for group in spec.node_groups:
        if group.capacity.market == "capacity_block":
            continue
        split = split_nodes(group, group.max_nodes)
        vcpus = max(t.vcpus for t in group.types)
        klass = quota_class(group.instance_types[0])
        if klass is None:
            continue
        need[(klass, "on-demand")] += (split.base + split.on_demand) * vcpus
        need[(klass, "spot")] += split.spot * vcpus
    return {k: v for k, v in need.items() if v}


def check_quotas(spec: StackSpec, quotas: Any) -> Iterable[DoctorFinding]:
    """The account's vCPU quotas against what max nodes would run."""
    for key, needed in sorted(vcpus_needed(spec).items()):
        code, name = QUOTAS[key]
        subject = f"{name} ({code})"
        try:
            value = _quota_value(quotas, code)
        except ClientError as err:
            yield _not_checked("quota", subject, err)
            continue
        if value < needed:
            yield DoctorFinding("blocker", "quota", subject, f"{value:g} vCPUs, max nodes need {needed}; "
                                "request an increase in Service Quotas before deploying")
        else:
            yield DoctorFinding("ok", "quota", subject, f"{value:g} vCPUs cover the {needed} max nodes need")


def _quota_value(quotas: Any, code: str) -> float:
    """The applied quota, or AWS's default where the account never changed it."""
    try:
        return float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
    except ClientError as err:
        if _error_code(err) != "NoSuchResourceException":
            raise
        default = quotas.get_aws_default_service_quota(ServiceCode="ec2", QuotaCode=code)
        return float(default["Quota"]["Value"])


def cost_tag_status(ce: Any, keys: Iterable[str] = COST_TAGS) -> dict[str, str | None]:
    """Each user-defined cost-allocation tag key's status: "Active", "Inactive", or None when AWS
    does not list it yet (it lists a key only after resources carry it, within a day). ClientError
    when the account may not ask (ce:ListCostAllocationTags)."""
    wanted = list(keys)
    listed = ce.list_cost_allocation_tags(TagKeys=wanted, Type="UserDefined")
    status = {t["TagKey"]: t.get("Status") for t in listed.get("CostAllocationTags", [])}
    return {key: status.get(key) for key in wanted}



def cost_tag_warning(spec: StackSpec, ce: Any) -> str | None:
    """One line when the budget's cost-allocation tag is not active (the budget then sees $0)."""
    try:
        state = cost_tag_status(ce, [STACK_TAG])[STACK_TAG]
    except (BotoCoreError, ClientError) as err:
        return f"cost tag {STACK_TAG}: could not check whether it is active ({describe(err)})"
    if state == "Active":
        return None
    what = "inactive" if state else "not active (AWS does not list it yet)"
    effect = (f"the budget (${spec.budget.monthly_limit_usd:,.0f}/month) sees $0 of this stack's spend and "
              "its scale-to-zero never fires" if spec.budget else "costs by this tag read $0")
    activate = ACTIVATE_TAG.format(key=STACK_TAG)
    return f"warning: cost-allocation tag {STACK_TAG} is {what}: {effect}; {activate}"

def check_cost_tags(spec: StackSpec, ce: Any, deployed: bool = True) -> Iterable[DoctorFinding]:
    """`gpucluster:stack` and `cost_center` active as cost-allocation tags.

    AWS Budgets counts only costs carrying an activated cost-allocation tag (AWS Billing user
    guide, "Activating user-defined cost allocation tags"), and the budget filters on
    `gpucluster:stack`: inactive, the budget sees $0 and its scale-to-zero never fires. For a
    stack with a budget that is a blocker, with one exception: a key AWS does not list yet on a
    stack not deployed yet, since AWS lists a key only after resources carry it (`deployed`:
    groups with this identity exist). `cost_center` only warns: no guardrail depends on it.
    """
    try:
        status = cost_tag_status(ce)
    except ClientError as err:
        yield _not_checked("cost tag", ", ".join(COST_TAGS), err)
        return
    for key in COST_TAGS:
        value, state = spec.tags[key], status[key]
        activate = ACTIVATE_TAG.format(key=key)
        guards = key == STACK_TAG and spec.budget is not None
        if state == "Active":
            yield DoctorFinding("ok", "cost tag", key, f"active (this stack: {key}={value})")
        elif state is not None:
            yield DoctorFinding("blocker" if guards else "warning", "cost tag", key,
                                "inactive: " + ("the budget sees $0 of this stack's spend and its "
                                                "scale-to-zero never fires; " if guards else
                                                "budgets filtering on it see no spend; ") + activate)
        elif guards and deployed:
            yield DoctorFinding("blocker", "cost tag", key, "not active (AWS does not list it yet; it "
                                "does within a day of resources carrying it): the budget sees $0 of "
                                f"this stack's spend and its scale-to-zero never fires; {activate}")
        else:
            yield DoctorFinding("warning", "cost tag", key, "not seen yet (AWS lists a tag after resources "
                                "carry it); activate it after the first deploy or budgets see no spend"
                                + ("; doctor blocks the next deploy until it is active" if guards else ""))


def identity_groups(spec: StackSpec, autoscaling: Any) -> list[dict[str, Any]]:
    """Every Auto Scaling group in the region tagged with this deployment's identity."""
    return stack_groups(autoscaling, spec.identity)


def own_group_names(outputs: Mapping[str, Any]) -> set[str]:
    """The Auto Scaling groups a deployed stack owns, from its outputs (`pulumi stack output --json`):
    `node_groups.<name>.asg_name`. Empty outputs (a stack never deployed) own none."""
    groups = outputs.get("node_groups") or {}
    if not isinstance(groups, Mapping):
        raise ValueError("node_groups is not a mapping of node groups")
    names = set()
    for name, group in groups.items():
        asg = group.get("asg_name") if isinstance(group, Mapping) else None
        if not isinstance(asg, str) or not asg:
            raise ValueError(f"node_groups.{name}.asg_name is missing")
        names.add(asg)
    return names


def check_identity(spec: StackSpec, groups: list[dict[str, Any]],
                   own: set[str] | None = None) -> Iterable[DoctorFinding]:
    """No Auto Scaling group carries this deployment's identity unless it is one of its groups.

    Such a group belongs to another deployment with the same organization, project, stack and
    cluster name (or one left behind by a destroyed or forgotten state): this stack's budget,
    idle and schedule stops would scale it, its pre-stop hook would run there as root, and
    `resume` would restart it. `own` (from the stack's outputs) says exactly which groups are
    this stack's; without it, a group is taken as this stack's when its node-group tag names a
    node group of the stack file and no other group claims that node group.
    """
    foreign = _foreign_groups(spec, groups) if own is None else {
        g["AutoScalingGroupName"]: "is not one of this stack's groups (its outputs)"
        for g in groups if g["AutoScalingGroupName"] not in own}
    for name, why in sorted(foreign.items()):
        yield DoctorFinding("blocker", "identity", name,
                            f"carries gpucluster:stack={spec.identity} but {why}: another deployment "
                            "with the same organization, project, stack and cluster name (or one left "
                            "behind) would stop, hook and resume this stack's groups, and this stack its; "
                            "give this cluster another cluster.name, or remove that group")
    if not foreign:
        yield DoctorFinding("ok", "identity", spec.identity, f"no other Auto Scaling group in {spec.region} "
                            f"carries it ({len(groups)} of this stack's)")


def _foreign_groups(spec: StackSpec, groups: list[dict[str, Any]]) -> dict[str, str]:
    """Without the stack's outputs: groups of no node group of the stack file, or of a node group
    more than one group claims (why, by group name)."""
    claims: dict[str | None, list[str]] = defaultdict(list)
    for g in groups:
        claims[group_tags(g).get(NODE_GROUP_TAG)].append(g["AutoScalingGroupName"])
    known = {g.name for g in spec.node_groups}
    removed = ("; if you removed that node group from the stack file, run doctor with --outputs "
               "(`pulumi stack output --json`) so it knows the stack's own groups")
    foreign: dict[str, str] = {}
    for node_group, names in claims.items():
        if node_group is None:
            why = f"has no {NODE_GROUP_TAG} tag (gpucluster tags every group it creates)"
        elif node_group not in known:
            why = f"its node group {node_group!r} is not in the stack file{removed}"
        elif len(names) > 1:
            why = f"{len(names)} groups claim node group {node_group!r} ({', '.join(sorted(names))})"
        else:
            continue
        foreign |= dict.fromkeys(names, why)
    return foreign


def run_checks(spec: StackSpec, clients: Clients | None = None, now: datetime | None = None,
               own_groups: set[str] | None = None) -> list[DoctorFinding]:
    """Every check, in order; DoctorError when AWS cannot be reached or no credentials exist.

    `own_groups`: the Auto Scaling groups the deployed stack owns (its outputs; an empty set
    before its first deploy), None when not known (see `check_identity`).
    """
    clients = clients or Clients.of(spec)
    groups: list[dict[str, Any]] = []

    def identity() -> Iterable[DoctorFinding]:
        try:
            groups.extend(identity_groups(spec, clients("autoscaling")))
        except ClientError as err:
            return [_not_checked("identity", spec.identity, err)]
        return check_identity(spec, groups, own_groups)

    def cost_tags() -> Iterable[DoctorFinding]:  # after identity(): deployed = its own groups exist
        deployed = bool(own_groups) if own_groups is not None else bool(groups)
        return check_cost_tags(spec, clients("ce"), deployed=deployed)

    checks: list[Callable[[], Iterable[DoctorFinding]]] = [
        lambda: check_offerings(spec, clients("ec2")),
        lambda: check_efa(spec, clients("ec2")),
        lambda: check_reservations(spec, clients("ec2"), now),
        lambda: check_quotas(spec, clients("service-quotas")),
        lambda: check_amis(spec, clients("ec2")),
        identity,
        cost_tags,
        lambda: check_iam_names(spec, clients("iam"), clients("sts")),
    ]
    if spec.scheduler.eks:
        checks.append(lambda: check_eks(spec, clients("eks")))
    findings: list[DoctorFinding] = []
    try:
        for run in checks:
            findings.extend(run())
    except BotoCoreError as err:  # no credentials, no network...: the one wording (ops/awserrors.py)
        raise DoctorError(describe(err)) from None
    except Exception as err:  # ResponseParserError is no BotoCoreError: an HTML page, not an answer
        if not from_parser(err):
            raise
        raise DoctorError(describe(err)) from None
    return findings


def has_blocker(findings: Iterable[DoctorFinding]) -> bool:
    return any(f.level == "blocker" for f in findings)


# ------------------------------------------------------------------ spot prices


def fetch_spot_prices(spec: StackSpec, ec2: Any = None, now: datetime | None = None) -> dict[str, Rate]:
    """Live spot price per node group: the mean of the latest Linux price in each of its zones.

    Capacity-block groups and groups AWS returns no price for are left out (the cost model
    then uses the catalog's typical discount for them).
    """
    ec2 = ec2 or make_client("ec2", spec.region)
    now = now or datetime.now(UTC)
    rates: dict[str, Rate] = {}
    for group in spec.node_groups:
        if group.capacity.market == "capacity_block":
            continue
        zones = spec.azs_of(group)
        first = group.instance_types[0]
        history = ec2.describe_spot_price_history(
            InstanceTypes=[first], ProductDescriptions=["Linux/UNIX"], StartTime=now,
            Filters=[{"Name": "availability-zone", "Values": zones}])["SpotPriceHistory"]
        latest: dict[str, dict[str, Any]] = {}
        for entry in history:
            zone = entry["AvailabilityZone"]
            if zone in zones and (zone not in latest or entry["Timestamp"] > latest[zone]["Timestamp"]):
                latest[zone] = entry
        if not latest:
            continue
        price = statistics.fmean(float(e["SpotPrice"]) for e in latest.values())
        stamp = max(e["Timestamp"] for e in latest.values())
        zones_seen = ", ".join(sorted(latest))
        rates[group.name] = Rate(price, f"spot, live: mean of the latest price in {zones_seen}",
                                 "EC2 DescribeSpotPriceHistory (Linux/UNIX)", f"{stamp:%Y-%m-%d %H:%M} UTC")
    return rates
