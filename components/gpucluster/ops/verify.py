"""`gpucluster verify`: a deployed stack checked in its account, read-only, for what only an account shows.

It owns the checklist run after `pulumi up`: each guardrail role may make every call its handler
makes (IAM's policy simulator), each node group's launch template launches (EC2 RunInstances with
DryRun) and its node role may read the scripts bundle, the cost-allocation tag is active, the notify
topic has a confirmed subscription, every guardrail schedule, rule and alarm exists and is enabled,
a stack without NAT has the interface endpoints its nodes need, and with observability on each node
role may remote-write to the AMP workspace. `plan_checks` lists the checks the stack file asks for,
each with a stable id (`guardrail-iam.autostop`, `launch-template.gpu`...) that the ledger of AWS
facts can name; `run_checks` runs them and returns one `Verification`. A check whose AWS call fails
(AccessDenied on the describe it needs, throttling past botocore's retries, a 5xx, a timeout, an
answer that is not AWS's) is `unknown` with the reason, never `pass`. Only Describe/Get/List calls,
the simulator and DryRun: nothing is created or changed. Clients come from `ops.Clients`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gpucluster.fleet.awsapi import group_tags
from gpucluster.fleet.tags import NODE_GROUP_TAG, STACK_TAG
from gpucluster.names import expected_names
from gpucluster.node.bundle import bundle_key
from gpucluster.ops import Clients, OpsError
from gpucluster.ops.awserrors import describe, from_parser
from gpucluster.ops.doctor import ACTIVATE_TAG, cost_tag_status
from gpucluster.ops.verifycheck import Deployed, Outcome, Result, Unknown, amp_workspace
from gpucluster.ops.verifyiam import Account, Denied, guardrail_calls, simulate
from gpucluster.spec import NodeGroupConfig, StackSpec

RESULTS: tuple[Result, ...] = ("pass", "fail", "unknown")

# The guardrail Lambdas: handler module -> its function's name after `<cluster>-` (aws/guardrail_*.py).
HANDLER_FUNCTIONS = {"budget_action": "budget-action", "spend_guard": "spend-guard", "report": "spend-report",
                     "autostop": "autostop", "capacity_block": "capacity-block", "job_restart": "job-restart",
                     "spot_interruption": "spot-interruption"}
# A VPC endpoint that works (EC2 API reference, VpcEndpoint.State; the model spells it "Available").
ENDPOINT_READY = "available"
ALARM_TYPES = ("aws:cloudwatch/metricAlarm:MetricAlarm", "aws:cloudwatch/compositeAlarm:CompositeAlarm")
# EC2 error codes that mean the request the template makes is wrong (EC2 API reference, "Error codes for
# the Amazon EC2 API"; ledger: ec2-template-error-codes). Any other code
# (credentials, throttling, capacity, a 5xx) says nothing of the template: the check is unknown.
TEMPLATE_ERRORS = ("InvalidParameter", "MissingParameter", "InvalidAMIID", "InvalidSubnetID", "InvalidGroup",
                   "InvalidKeyPair", "InvalidSnapshot", "InvalidLaunchTemplate", "InvalidBlockDeviceMapping",
                   "InvalidPlacementGroup", "InvalidNetworkInterface")
# CloudWatch DescribeAlarms takes at most 100 names a call (CloudWatch API reference, AlarmNames).
ALARMS_PER_CALL = 100


@dataclass(frozen=True)
class PlannedCheck:
    """A check the stack asks for: a stable id, what it checks, on what, and how to run it."""

    id: str
    name: str
    subject: str
    run: Callable[[], Outcome]


@dataclass(frozen=True)
class CheckResult:
    id: str
    name: str
    subject: str
    result: Result
    detail: str
    remedy: str | None


@dataclass(frozen=True)
class Verification:
    """Every check's result for one deployed stack, in the account `account`."""

    account: str
    checks: list[CheckResult]

    def count(self, result: Result) -> int:
        return sum(1 for c in self.checks if c.result == result)

    @property
    def passed(self) -> bool:
        """Every check passed: a failure or a check that could not run is not a pass."""
        return all(c.result == "pass" for c in self.checks)


class JobRefused(OpsError):
    """`--job` asked of a stack that runs no Slurm: one line, the CLI's exit 2, before any AWS call."""


class VerifyError(OpsError):
    """AWS cannot be asked at all (no credentials, no endpoint, not an AWS answer): nothing was checked."""


def unreachable(err: BaseException) -> VerifyError:
    return VerifyError(describe(err))  # the one wording (ops/awserrors.py): no credentials, no network...


def account_of(clients: Clients, region: str) -> Account:
    """Who is asking (STS GetCallerIdentity needs no permission): the partition and account of every ARN.

    Any error here means AWS cannot be asked at all: VerifyError (the CLI's exit 2)."""
    try:
        arn = str(clients("sts").get_caller_identity()["Arn"])
    except (BotoCoreError, ClientError) as err:
        raise unreachable(err) from None
    except Exception as err:
        if not from_parser(err):
            raise
        raise unreachable(err) from None
    parts = arn.split(":")
    return Account(partition=parts[1], region=region, account=parts[4], caller=arn)


# ---------------------------------------------------------------------------- the checks


def check_guardrail_role(deployed: Deployed, module: str, function: str) -> Outcome:
    """The handler's role may make every call the handler makes, on this stack's resources."""
    try:
        config = deployed.clients("lambda").get_function_configuration(FunctionName=function)
    except ClientError as err:
        if str(err.response.get("Error", {}).get("Code")) != "ResourceNotFoundException":
            raise
        return Outcome("fail", f"no Lambda function {function}: the guardrail is not deployed",
                       "run `pulumi up` for this stack")
    environment = config.get("Environment", {}).get("Variables", {})
    spec = deployed.spec
    # The Capacity Block handler scales only the groups on a block (aws/guardrail_events.py).
    scaled = ({g.name for g in spec.node_groups if g.capacity.market == "capacity_block"}
              if module == "capacity_block" else None)
    calls, missing = guardrail_calls(module, function, environment, deployed.account, spec.identity,
                                     deployed.clients, partial(deployed.asg_arns, scaled),
                                     starts_groups=bool(spec.autostop.start_schedule))
    denied = simulate(deployed.clients("iam"), str(config["Role"]), calls)
    return _simulated(denied, f"{len(calls)} calls of {module}", missing,
                      "the role's policy (the guardrail's `-policy` resource) or an SCP or permissions "
                      "boundary refuses them: run `pulumi up` to restore the policy, or lift the SCP")


def _simulated(denied: list[Denied], what: str, caveats: Sequence[str],
               remedy: str) -> Outcome:
    """fail on any refusal; unknown when some calls could not be simulated; else pass."""
    if denied:
        more = f"; and {len(denied) - 4} more" if len(denied) > 4 else ""
        shown = "; ".join(str(d) for d in denied[:4]) + more
        return Outcome("fail", f"the simulator refuses {len(denied)} of {what}: {shown}", remedy)
    if caveats:
        return Outcome("unknown", f"the simulator allows all {what}, but {'; '.join(caveats)}")
    return Outcome("pass", f"the policy simulator allows all {what}")


def check_launch_template(deployed: Deployed, group: NodeGroupConfig) -> Outcome:
    """EC2 accepts the group's launch template in one of its subnets (RunInstances, DryRun)."""
    template = deployed.launch_template(group.name)
    if not template:
        return Outcome("fail", f"no launch template tagged {STACK_TAG}={deployed.spec.identity} and "
                       f"{NODE_GROUP_TAG}={group.name}", "run `pulumi up` for this stack")
    subnet = _subnet_of(deployed, group.name)
    if subnet is None:
        return Outcome("unknown", f"no Auto Scaling group of node group {group.name} with a subnet was found "
                       "to launch in (a Slurm stack's groups are AWS PCS's: left for its own checks)")
    ec2 = deployed.clients("ec2")
    request: dict[str, Any] = {"DryRun": True, "MinCount": 1, "MaxCount": 1,
                               "LaunchTemplate": {"LaunchTemplateId": template["LaunchTemplateId"],
                                                  "Version": "$Default"}}
    if "InstanceType" not in template["Data"]:
        request["InstanceType"] = group.instance_types[0]
    interfaces = template["Data"].get("NetworkInterfaces")
    if interfaces:  # the template's own interfaces, placed in the group's subnet as Auto Scaling does
        takes = set(ec2.meta.service_model.operation_model("RunInstances").input_shape
                    .members["NetworkInterfaces"].member.members)
        request["NetworkInterfaces"] = [{**{k: v for k, v in nic.items() if k in takes}, "SubnetId": subnet}
                                        for nic in interfaces]
    else:
        request["SubnetId"] = subnet
    where = f" in {subnet}"
    name = template["LaunchTemplateName"]
    try:
        ec2.run_instances(**request)
    except ClientError as err:
        code = str(err.response.get("Error", {}).get("Code"))
        if code == "DryRunOperation":
            return Outcome("pass", f"{name} $Default{where}: EC2 would launch it (DryRun checks your "
                           "permissions and the parameters, not capacity; the group launches with its own "
                           "service-linked role)")
        if code == "UnauthorizedOperation":
            return Outcome("fail", f"{name}{where}: EC2 refuses the launch as you: {_first(err)}",
                           "decode the message (`aws sts decode-authorization-message`): it names the "
                           "action and resource refused: your missing ec2:RunInstances / iam:PassRole (run "
                           "verify as a role that may launch, e.g. the deploy role) or a key, profile or "
                           "security group the template names that nobody may use")
        if code.startswith(TEMPLATE_ERRORS):
            return Outcome("fail", f"{name}{where}: EC2 rejects the template: {code}: {_first(err)}",
                           "compare the template with the stack file and run `pulumi up`")
        raise
    return Outcome("unknown", f"{name}: EC2 answered a DryRun without DryRunOperation, which it never should")


def _subnet_of(deployed: Deployed, group: str) -> str | None:
    """A subnet the group launches in: its Auto Scaling group's first (none on a Slurm stack)."""
    for g in deployed.groups():
        if group_tags(g).get(NODE_GROUP_TAG) == group and g.get("VPCZoneIdentifier"):
            return str(g["VPCZoneIdentifier"]).split(",")[0]
    return None


def _first(err: ClientError) -> str:
    return " ".join(str(err.response.get("Error", {}).get("Message", "")).split())[:300]


def check_scripts_bundle(deployed: Deployed, group: str) -> Outcome:
    """The node role may read this gpucluster's scripts bundle (simulated s3:GetObject)."""
    role, bucket, key = deployed.node_role(group), deployed.scripts_bucket(), bundle_key()
    arn = f"arn:{deployed.account.partition}:s3:::{bucket}/{key}"
    denied = simulate(deployed.clients("iam"), role, [
        ("s3:GetObject", arn, {"s3:ResourceAccount": deployed.account.account})])
    caveat = ("the key is this gpucluster version's bundle: a stack deployed by another version boots from "
              "its own key under the same prefix")
    if denied:
        return Outcome("fail", f"{role} may not read s3://{bucket}/{key} ({caveat})",
                       "run `pulumi up` (the role's `-scripts` policy grants it), or lift the SCP or "
                       "boundary that refuses it")
    return Outcome("pass", f"{role.rpartition('/')[2]} may read s3://{bucket}/{key} ({caveat})")


def check_cost_tag(deployed: Deployed) -> Outcome:
    """The budget's cost-allocation tag is active (Cost Explorer ListCostAllocationTags)."""
    state = cost_tag_status(deployed.clients("ce"), [STACK_TAG])[STACK_TAG]
    if state == "Active":
        return Outcome("pass", f"{STACK_TAG} is an active cost-allocation tag")
    what = "inactive" if state else "not listed yet (AWS lists a key within a day of resources carrying it)"
    effect = ("the budget sees $0 of this stack's spend and never acts" if deployed.spec.budget
              else "costs by this tag read $0")
    return Outcome("fail", f"{STACK_TAG} is {what}: {effect}", ACTIVATE_TAG.format(key=STACK_TAG))


def check_subscription(deployed: Deployed, topic_name: str) -> Outcome:
    """The notify topic has a confirmed subscription (SNS: an unconfirmed one is `PendingConfirmation`)."""
    a = deployed.account
    arn = f"arn:{a.partition}:sns:{a.region}:{a.account}:{topic_name}"
    try:
        pages = deployed.clients("sns").get_paginator("list_subscriptions_by_topic").paginate(TopicArn=arn)
        subscriptions = [s for page in pages for s in page.get("Subscriptions", [])]
    except ClientError as err:
        if str(err.response.get("Error", {}).get("Code")) != "NotFound":
            raise
        return Outcome("fail", f"no SNS topic {arn}", "run `pulumi up` for this stack")
    confirmed = [s for s in subscriptions if str(s.get("SubscriptionArn", "")).startswith("arn:")]
    if confirmed:
        protocols = ", ".join(sorted({str(s.get("Protocol")) for s in confirmed}))
        return Outcome("pass", f"{len(confirmed)} confirmed subscription(s) ({protocols}) to {topic_name}")
    pending = len(subscriptions)
    return Outcome("fail", f"{topic_name} has {pending} subscription(s), none confirmed: guardrail notices "
                   "reach nobody", "confirm the subscription (the link in AWS Notifications' e-mail), or "
                   "set guardrails' notify address and run `pulumi up`")


def check_schedule(deployed: Deployed, name: str) -> Outcome:
    """An EventBridge Scheduler schedule exists (group `default`) and is ENABLED."""
    try:
        state = deployed.clients("scheduler").get_schedule(Name=name, GroupName="default").get("State")
    except ClientError as err:
        if str(err.response.get("Error", {}).get("Code")) != "ResourceNotFoundException":
            raise
        return Outcome("fail", f"no schedule {name} in group default", "run `pulumi up` for this stack")
    if state == "ENABLED":
        return Outcome("pass", f"schedule {name} is enabled")
    return Outcome("fail", f"schedule {name} is {state}: its guardrail never runs",
                   "`aws scheduler update-schedule` with --state ENABLED, or `pulumi up`")


def check_rule(deployed: Deployed, name: str) -> Outcome:
    """An EventBridge rule exists on the default bus and is ENABLED."""
    try:
        state = deployed.clients("events").describe_rule(Name=name).get("State")
    except ClientError as err:
        if str(err.response.get("Error", {}).get("Code")) != "ResourceNotFoundException":
            raise
        return Outcome("fail", f"no EventBridge rule {name}", "run `pulumi up` for this stack")
    if state == "ENABLED":
        return Outcome("pass", f"rule {name} is enabled")
    return Outcome("fail", f"rule {name} is {state}: its guardrail never runs",
                   f"`aws events enable-rule --name {name}`, or `pulumi up`")


def check_alarms(deployed: Deployed, names: Sequence[str]) -> Outcome:
    """Every guardrail alarm exists with its actions enabled (DescribeAlarms, metric and composite)."""
    found: dict[str, bool] = {}
    cloudwatch = deployed.clients("cloudwatch")
    for start in range(0, len(names), ALARMS_PER_CALL):
        pages = cloudwatch.get_paginator("describe_alarms").paginate(
            AlarmNames=list(names[start:start + ALARMS_PER_CALL]),
            AlarmTypes=["CompositeAlarm", "MetricAlarm"])
        for page in pages:
            for alarm in [*page.get("MetricAlarms", []), *page.get("CompositeAlarms", [])]:
                found[alarm["AlarmName"]] = bool(alarm.get("ActionsEnabled", True))
    missing = [n for n in names if n not in found]
    disabled = [n for n in names if found.get(n) is False]
    if not missing and not disabled:
        return Outcome("pass", f"all {len(names)} alarms exist with their actions enabled")
    parts = ([f"missing: {', '.join(missing)}"] if missing else []) + (
        [f"actions disabled: {', '.join(disabled)}"] if disabled else [])
    return Outcome("fail", "; ".join(parts), "run `pulumi up`; for disabled actions "
                   "`aws cloudwatch enable-alarm-actions --alarm-names ...`")


def check_endpoints(deployed: Deployed, services: Sequence[str]) -> Outcome:
    """Every VPC endpoint nodes without NAT need exists in the stack's VPC and is available."""
    region = deployed.account.region
    pages = deployed.clients("ec2").get_paginator("describe_vpc_endpoints").paginate(
        Filters=[{"Name": f"tag:{STACK_TAG}", "Values": [deployed.spec.identity]}])
    prefix = f"com.amazonaws.{region}."
    # The service is what follows the region, dots included (ecr.api, ecr.dkr).
    states = {str(e["ServiceName"]).removeprefix(prefix): str(e.get("State", "")).lower()
              for page in pages for e in page.get("VpcEndpoints", [])
              if str(e.get("ServiceName", "")).startswith(prefix)}
    missing = [s for s in services if s not in states]
    unready = [f"{s} ({states[s]})" for s in services if s in states and states[s] != ENDPOINT_READY]
    if not missing and not unready:
        return Outcome("pass", f"{len(services)} endpoints available: {', '.join(services)}")
    parts = ([f"missing: {', '.join(missing)}"] if missing else []) + (
        [f"not available: {', '.join(unready)}"] if unready else [])
    return Outcome("fail", "; ".join(parts) + " (nodes without NAT reach these services only through them)",
                   "run `pulumi up` (a missing endpoint the program does not create yet needs "
                   "network.nat_gateway: true, or the endpoint added to the VPC)")


def check_remote_write(deployed: Deployed, group: str) -> Outcome:
    """The node role may remote-write to the stack's AMP workspace (simulated aps:RemoteWrite)."""
    role = deployed.node_role(group)
    arn, context = amp_workspace(deployed)
    denied = simulate(deployed.clients("iam"), role, [("aps:RemoteWrite", arn, context)])
    if denied:
        return Outcome("fail", f"{role.rpartition('/')[2]} may not aps:RemoteWrite to {arn}: the "
                       "node's metrics are dropped",
                       "run `pulumi up` (the node role's metrics policy grants it)")
    return Outcome("pass", f"{role.rpartition('/')[2]} may aps:RemoteWrite to {arn} (simulated: whether "
                   "samples arrive is a question for Prometheus, not IAM)")


# ----------------------------------------------------------------------------- plan, run


def no_nat_endpoints(spec: StackSpec) -> list[str]:
    """The interface endpoints a created VPC without NAT needs: what aws/network.py creates for this stack
    (`pricing.interface_endpoints`, the one list; with observability aps-workspaces, on Slurm pcs, on EKS
    its private-cluster endpoints)."""
    from gpucluster.pricing import interface_endpoints

    return list(interface_endpoints(spec))


def plan_checks(spec: StackSpec, clients: Clients, account: Account, *,
                job: bool = False) -> list[PlannedCheck]:
    """The checks this stack asks for, in order, each bound to the account's lookups (nothing run yet);
    `job`: also run `srun -N1 hostname` on each Slurm partition (the one check that starts something)."""
    from gpucluster.ops.verifyfeatures import feature_checks

    deployed = Deployed(spec, clients, account)
    c, names = spec.cluster.name, expected_names(spec)
    physical = [(n.physical.type, n.physical.name) for n in names]
    checks: list[PlannedCheck] = []

    def add(id_: str, name: str, subject: str, run: Callable[[], Outcome]) -> None:
        checks.append(PlannedCheck(id_, name, subject, run))

    functions = {name for type_, name in physical if type_ == "aws:lambda/function:Function"}
    for module, suffix in HANDLER_FUNCTIONS.items():
        if f"{c}-{suffix}" in functions:
            add(f"guardrail-iam.{module}", "guardrail role may make its handler's calls", f"{c}-{suffix}",
                partial(check_guardrail_role, deployed, module, f"{c}-{suffix}"))
    for group in spec.node_groups:
        add(f"launch-template.{group.name}", "launch template launches (EC2 DryRun)", group.name,
            partial(check_launch_template, deployed, group))
        add(f"scripts-bundle.{group.name}", "node role may read the scripts bundle", group.name,
            partial(check_scripts_bundle, deployed, group.name))
    add("cost-tag", "cost-allocation tag is active", STACK_TAG, lambda: check_cost_tag(deployed))
    topic = next(name for type_, name in physical if type_ == "aws:sns/topic:Topic")
    add("notify-subscription", "notify topic has a confirmed subscription", topic,
        lambda: check_subscription(deployed, topic))
    for type_, name in physical:
        if type_ == "aws:scheduler/schedule:Schedule":
            add(f"schedule.{name.removeprefix(f'{c}-')}", "guardrail schedule exists and is enabled", name,
                partial(check_schedule, deployed, name))
        elif type_ == "aws:cloudwatch/eventRule:EventRule":
            add(f"rule.{name.removeprefix(f'{c}-')}", "guardrail rule exists and is enabled", name,
                partial(check_rule, deployed, name))
    alarm_names = [name for type_, name in physical if type_ in ALARM_TYPES]
    if alarm_names:
        add("alarms", "guardrail alarms exist with actions enabled", f"{len(alarm_names)} alarms",
            lambda: check_all_alarms(deployed, alarm_names))
    if spec.network.vpc_cidr is not None and not spec.network.nat_gateway:
        services = no_nat_endpoints(spec)
        add("endpoints", "VPC endpoints nodes without NAT need", ", ".join(services),
            lambda: check_endpoints(deployed, services))
    if spec.observability.prometheus.active:
        for group in spec.node_groups:
            add(f"amp-remote-write.{group.name}", "node role may remote-write to AMP", group.name,
                partial(check_remote_write, deployed, group.name))
    for id_, name, subject, run in feature_checks(deployed, job=job):
        add(id_, name, subject, run)
    return checks


def _deployed_alarm_names(deployed: Deployed, planned: Sequence[str]) -> tuple[list[str], list[str]]:
    """The alarm names with each group's real Auto Scaling group name for the planned one (Pulumi names
    a group `<cluster>-<group>-asg-<random>`: `names.autoname` only stands in for the random part), and
    the node groups whose group was not found (their alarms are left out)."""
    from gpucluster.names import autoname

    real = {group_tags(g).get(NODE_GROUP_TAG): str(g["AutoScalingGroupName"]) for g in deployed.groups()}
    stand_ins = {autoname(f"{deployed.spec.cluster.name}-{g.name}-asg"): g.name
                 for g in deployed.spec.node_groups}
    names, unresolved = [], set()
    for name in planned:
        group = next((g for stand_in, g in stand_ins.items() if name.startswith(stand_in)), None)
        if group is None:
            names.append(name)
        elif group in real:
            names.append(real[group] + name[len(autoname(f"{deployed.spec.cluster.name}-{group}-asg")):])
        else:
            unresolved.add(group)
    return names, sorted(unresolved)


def check_all_alarms(deployed: Deployed, planned: Sequence[str]) -> Outcome:
    """`check_alarms` on the deployed names; node groups without an Auto Scaling group make it unknown."""
    names, unresolved = _deployed_alarm_names(deployed, planned)
    outcome = check_alarms(deployed, names)
    if not unresolved:
        return outcome
    note = (f"the alarms of node group(s) {', '.join(unresolved)} were not checked: no Auto Scaling group of "
            "theirs was found (a Slurm stack's per-group alarms are left for its own checks)")
    if outcome.result == "pass":
        return Outcome("unknown", f"{outcome.detail}; {note}")
    return Outcome(outcome.result, f"{outcome.detail}; {note}", outcome.remedy)


def run_check(check: PlannedCheck) -> CheckResult:
    """Run one check; any AWS error or missing prerequisite makes it `unknown`, with the reason."""
    try:
        outcome = check.run()
    except Unknown as err:
        outcome = Outcome("unknown", f"could not check: {err}")
    except (BotoCoreError, ClientError) as err:
        outcome = Outcome("unknown", f"could not check: {describe(err)}")
    except Exception as err:
        if not from_parser(err):
            raise
        outcome = Outcome("unknown", f"could not check: {describe(err)}")
    remedy = outcome.remedy if outcome.result == "fail" else None
    return CheckResult(check.id, check.name, check.subject, outcome.result, outcome.detail, remedy)


def verify(spec: StackSpec, clients: Clients | None = None, *, job: bool = False) -> Verification:
    """Every check of the deployed stack (`job`: with the Slurm or EKS test job); VerifyError when AWS cannot
    be asked at all."""
    if job and not (spec.scheduler.slurm or spec.scheduler.eks):
        raise JobRefused(f"--job runs a Slurm job: stack {spec.stack} has no Slurm (scheduler.type: none)")
    clients = clients or Clients.of(spec)
    account = account_of(clients, spec.region)
    return Verification(account.account, [run_check(c) for c in plan_checks(spec, clients, account, job=job)])


def counts(verification: Verification) -> Mapping[str, int]:
    return {result: verification.count(result) for result in RESULTS}
