"""Spend guardrails: a budget that scales compute to zero, idle auto-stop and schedules, spot hooks.

It owns the AWS wiring around the guardrail Lambdas of `components/gpucluster/lambdas`:
the budget and its notifications, the encrypted SNS topics, one CloudWatch
alarm per node group, the EventBridge rules and Scheduler schedules that invoke
the Lambdas, the Lambdas themselves (packaged from `components/gpucluster/lambdas`) and one
least-privilege role per Lambda. It must never delete anything and never grant
a delete: every action it wires scales Auto Scaling groups of this stack to
zero, and data is never touched. It must not build or change the node groups:
it is handed their names and ARNs (`GuardedGroup`), and may be handed Auto
Scaling groups gpucluster did not create (an EKS managed node group's, say);
for those it only adds the `gpucluster:stack` tag (`tag_groups`), which the
Lambdas' lookups and IAM conditions select groups and instances by.

This module holds the component, its args and which parts it builds; the parts are in
`guardrail_lambda` (the functions, their packaging and roles), `guardrail_budget` (topic, budget,
spend report), `guardrail_spend` (the spend guard's schedule) and `guardrail_events` (idle alarms,
schedules, spot, Capacity Block, job restart).
"""

from typing import Any, NotRequired, TypedDict

import pulumi
import pulumi_aws as aws

from gpucluster.aws.args import (
    GuardrailsModel,
    component_options,
    guardrails_checks,
    owned_tags,
    type_token,
    validate,
)
from gpucluster.aws.guardrail_budget import Budget, Notifications, SpendReport
from gpucluster.aws.guardrail_events import (
    AutoStop,
    CapacityBlockExpiry,
    JobRestart,
    SpotInterruption,
    capacity_block_groups,
    uses_spot,
)
from gpucluster.aws.guardrail_lambda import GuardrailContext, PcsGuard, old_type
from gpucluster.aws.guardrail_spend import SpendGuard
from gpucluster.aws.guardrail_state import GuardrailAlarms, GuardState
from gpucluster.aws.iam import boundary_arn
from gpucluster.aws.settings import AutoStopSettings, BudgetSettings, SpotSettings
from gpucluster.fleet.tags import STACK_TAG
from gpucluster.pricing import region_guard_prices

__all__ = ["STACK_TAG", "GuardedGroup", "Guardrails", "GuardrailsArgs", "PcsGuard"]


class GuardedGroup(TypedDict):
    """An Auto Scaling group the guardrails stop, start and watch (any group, gpucluster's or not)."""

    name: str
    """Label in resource names and alarm texts (2-24 characters a-z, 0-9, '-'); unique."""
    asg_name: pulumi.Input[str]
    """The Auto Scaling group's name."""
    asg_arn: pulumi.Input[str]
    """The Auto Scaling group's ARN: the guardrail roles may change only the groups listed."""
    can_run_spot: bool
    """The group may hold spot instances: the spot-interruption hook is built for it."""
    capacity_block_reservation_id: NotRequired[str]
    """The Capacity Block (cr-...) the group launches into: it is stopped before the block ends."""


class GuardrailsArgs(TypedDict):
    """Budget, idle auto-stop, schedules and spot hooks for Auto Scaling groups of GPU nodes."""

    groups: list[GuardedGroup]
    """The groups to guard (1-20)."""
    cluster_name: str
    """Prefix of every name (Lambdas, topics, rules, schedules, the budget): 2-24 characters."""
    identity: str
    """The gpucluster:stack tag value: the budget counts costs, the Lambdas act on groups, carrying it."""
    region: str
    """AWS region of the groups, e.g. us-east-1."""
    tags: NotRequired[dict[str, str]]
    """Tags of every resource."""
    budget: NotRequired[BudgetSettings]
    """Monthly budget, alerts and the scale-to-zero action, as a stack file's budget section."""
    autostop: NotRequired[AutoStopSettings]
    """Idle stop, schedules, maximum lifetime and the pre-stop hook, as a stack file's autostop section."""
    spot: NotRequired[SpotSettings]
    """The spot-interruption hook, as a stack file's spot section."""
    tag_groups: NotRequired[bool]
    """Give each group the gpucluster:stack tag (for groups gpucluster did not create; default false)."""
    permissions_boundary: NotRequired[str]
    """Name of a customer managed policy every guardrail role (Lambdas, Scheduler) carries as its boundary."""
    spend_prices: NotRequired[dict[str, Any]]
    """The spend guard's price table (gpucluster.pricing.guard_prices: on-demand, Capacity Block and
    committed-base rates, fixed costs per hour); default: the catalog's on-demand rate of every type."""
    notify_emails: NotRequired[list[str]]
    """E-mail subscribers of the guardrail topic, besides budget.emails (a stack's notifications.emails)."""
    restart_jobs: NotRequired[bool]
    """Re-launch `gpucluster run --restart-on-replace` jobs when a replacement brings their group back to
    size (the groups' nodes must run gpucluster's node bootstrap; default false)."""


class Guardrails(pulumi.ComponentResource):
    """Every spend guardrail of a set of Auto Scaling groups: budget, auto-stop, spot hooks, their topic.

    Guardrail roles may change only the listed groups, and only while they carry the
    `gpucluster:stack` tag with `identity`. Parts not asked for are not built: no budget
    without `budget`, no auto-stop unless `autostop.enabled`, no spot handling unless a
    group can run spot, no block-expiry stop unless a group runs on a Capacity Block.

    Groups gpucluster did not create (an EKS managed node group's ASG): set `tag_groups`, so an
    `aws.autoscaling.Tag` gives each the identity tag (the Lambdas' lookups and IAM conditions
    need it; instances launched from then on carry it, which the pre-stop and spot hooks' SSM
    permission needs). Idle auto-stop watches the GPU metric the gpucluster node bootstrap
    publishes (`nvidia_smi_utilization_gpu` by `AutoScalingGroupName` in the namespace
    `gpucluster/<cluster_name>`, the only one the node role may publish into): on nodes that do
    not publish it the alarm only notifies (missing data never stops). Python users also get
    `outputs` (what a stack exports) and the parts (`budget`, `autostop`, `spot`, `notifications`,
    `group_tags`).
    """

    notify_topic_arn: pulumi.Output[str] | None
    """The guardrail topic: what the guardrails did, budget alerts, missing GPU metrics."""
    budget_name: pulumi.Output[str] | None
    """The AWS Budgets budget (with budget)."""
    budget_action_topic_arn: pulumi.Output[str] | None
    """The topic the budget's scale-to-zero notification goes to (with budget.action_threshold_percent)."""
    function_names: pulumi.Output[dict[str, str]] | None
    """Guardrail Lambda function names: budget_action, autostop, spot_interruption, capacity_block,
    job_restart (those built)."""
    idle_alarm_names: pulumi.Output[dict[str, str]] | None
    """Group label -> its idle alarm (with autostop)."""
    schedule_names: pulumi.Output[dict[str, str]] | None
    """stop / start / lifetime -> its EventBridge Scheduler schedule (those configured)."""

    def __init__(self, name: str, args: GuardrailsArgs, opts: pulumi.ResourceOptions | None = None, *,
                 pcs: PcsGuard | None = None) -> None:
        """`pcs`: a Slurm stack's PCS cluster (`GpuCluster.pcs` as a `PcsGuard`): the stopping Lambdas get
        PCS_CLUSTER_ID and may scale only its node groups and reach only its login node."""
        m = validate("Guardrails", name, GuardrailsModel, args, guardrails_checks)
        super().__init__(type_token("Guardrails"), name, None,
                         component_options(opts, old_type("Guardrails")))
        child = pulumi.ResourceOptions(parent=self)
        self.budget: Budget | None = None
        self.autostop: AutoStop | None = None
        self.spot: SpotInterruption | None = None
        self.report: SpendReport | None = None
        self.spend_guard: SpendGuard | None = None
        self.capacity_block: CapacityBlockExpiry | None = None
        self.job_restart: JobRestart | None = None
        self.notifications: Notifications | None = None
        self.notify_topic_arn = self.budget_name = self.budget_action_topic_arn = None
        self.function_names = self.idle_alarm_names = self.schedule_names = None
        self.group_tags: dict[str, aws.autoscaling.Tag] = {}
        if m.tag_groups:
            # pulumi-aws autoscaling.Tag docs: tags an ASG managed elsewhere (their example is an EKS
            # managed node group's). Do not use it on a group whose own program sets its tags.
            self.group_tags = {
                g.name: aws.autoscaling.Tag(
                    f"{name}-tag-{g.name}", autoscaling_group_name=g.asg_name,
                    tag={"key": STACK_TAG, "value": m.identity, "propagate_at_launch": True}, opts=child)
                for g in m.groups}
        self.outputs: dict[str, Any] = {}
        blocks = capacity_block_groups(m.groups)
        wanted = (m.budget is not None or m.autostop.enabled or uses_spot(m.groups) or bool(blocks)
                  or m.restart_jobs)
        if not wanted:
            self.register_outputs(self.outputs)
            return
        invoke = pulumi.InvokeOutputOptions(parent=self)
        account = aws.get_caller_identity_output(opts=invoke).account_id
        partition = aws.get_partition_output(opts=invoke).partition
        prefix = m.cluster_name
        self.notifications = Notifications(f"{name}-notify", m, prefix, partition, account, opts=child)
        # The stopping handlers (budget action, autostop, Capacity Block) keep their state in a table.
        stops = ((m.budget is not None and m.budget.action_threshold_percent is not None)
                 or m.autostop.enabled or bool(blocks))
        self.state: GuardState | None = None
        if stops:
            self.state = GuardState(f"{name}-state", identity=m.identity, key_arn=self.notifications.key.arn,
                                    tags=owned_tags(m.tags, m.identity, m.cluster_name), opts=child)
            self.outputs["state_table_name"] = self.state.table_name
        ctx = GuardrailContext(args=m, prefix=prefix, partition=partition, account=account,
                       notify_topic_arn=self.notifications.topic.arn, key_arn=self.notifications.key.arn,
                       permissions_boundary=boundary_arn(partition, account, m.permissions_boundary)
                       if m.permissions_boundary else None,
                       state_table_arn=self.state.table.arn if self.state else None, pcs=pcs)
        self.outputs["notify_topic_arn"] = self.notify_topic_arn = ctx.notify_topic_arn
        functions: dict[str, str] = {}
        if m.budget is not None:
            self.budget = Budget(f"{name}-budget", ctx, depends_on=[self.notifications.topic_policy],
                                 opts=child)
            self.budget_name = pulumi.Output.from_input(self.budget.budget_name)
            self.outputs["budget_name"] = self.budget.budget_name
            if self.budget.action_topic is not None and self.budget.function is not None:
                self.outputs["budget_action_topic_arn"] = self.budget_action_topic_arn = \
                    self.budget.action_topic.arn
                functions["budget_action"] = self.budget.function.function_name
        if m.budget is not None and m.budget.action_threshold_percent is not None:
            self.spend_guard = SpendGuard(f"{name}-spend", ctx,
                                          m.spend_prices or region_guard_prices(m.region), opts=child)
            functions["spend_guard"] = self.spend_guard.function.function_name
        if m.budget is not None and m.budget.report is not None:
            self.report = SpendReport(f"{name}-report", ctx, opts=child)
            functions["report"] = self.report.function.function_name
        if m.autostop.enabled:
            self.autostop = AutoStop(f"{name}-autostop", ctx, opts=child)
            functions["autostop"] = self.autostop.function.function_name
            self.outputs["idle_alarm_names"] = dict(self.autostop.alarm_names)
            self.outputs["schedule_names"] = {p: s.name for p, s in self.autostop.schedules.items()}
            self.idle_alarm_names = pulumi.Output.from_input(self.outputs["idle_alarm_names"])
            self.schedule_names = pulumi.Output.from_input(self.outputs["schedule_names"])
        if uses_spot(m.groups):
            self.spot = SpotInterruption(f"{name}-spot", ctx, opts=child)
            functions["spot_interruption"] = self.spot.function.function_name
        if blocks:
            # "-blocks": the handler role's auto-name fits IAM's 64 with the longest cluster name.
            self.capacity_block = CapacityBlockExpiry(f"{name}-blocks", ctx, opts=child)
            functions["capacity_block"] = self.capacity_block.function.function_name
        if m.restart_jobs:
            self.job_restart = JobRestart(f"{name}-jobs", ctx, opts=child)
            functions["job_restart"] = self.job_restart.function.function_name
        self.outputs["function_names"] = functions
        self.function_names = pulumi.Output.from_input(functions)
        # A guardrail that fails, is throttled or cannot reach its on-failure destination tells a person.
        self.alarms = GuardrailAlarms(f"{name}-watch", ctx, functions, opts=child)
        self.register_outputs(self.outputs)
