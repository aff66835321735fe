"""Day-two commands on a deployed stack's node groups: status, resume, nodes, scale, stop, start.

It owns their options, confirmations, tables, `--json` documents and exit codes (0 fine, 1 a
change that failed or was declined, 2 invalid input or an AWS error); the work is in
`gpucluster.ops` (status, scale, nodes, overview). Every command finds the stack's resources
by its identity tag (`StackSpec.identity`), in the stack file's region. It must never import
another command module.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucluster import pricing
from gpucluster.cli import common, render
from gpucluster.cli.common import (
    EXIT_BLOCKED,
    EXIT_OK,
    DryRunOption,
    GroupOption,
    JsonOption,
    RequiredGroup,
    StackArg,
    YesOption,
    build_spec,
    confirm_or_exit,
    fail_usage,
    head,
    ops_call,
    usd,
)

if TYPE_CHECKING:
    from gpucluster.fleet.nodegroups import ResumeResult
    from gpucluster.ops.boottimes import Figure, GroupBootTimes
    from gpucluster.ops.nodes import Node
    from gpucluster.ops.overview import StackOverview
    from gpucluster.ops.resume import RestorePlan, ResumeCandidate, ResumeOutcome
    from gpucluster.ops.scale import ScalePlan
    from gpucluster.ops.status import GroupStatus
    from gpucluster.ops.stopstart import StopOutcome, StopPlan
    from gpucluster.spec import StackSpec


def group_label(r: GroupStatus) -> str:
    """What `--group` takes: the node group's name from the stack file (the Auto Scaling group's
    name only for a group without the node-group tag)."""
    return r.node_group or r.name


def stopped_cell(r: GroupStatus) -> str:
    """Who stopped the group; a stop that failed or is under way says so (never plain `stopped`)."""
    if r.stop_failed:
        return f"{r.stopped_by or '?'} (stop failed)"
    if r.state in ("stopping", "starting"):
        return f"{r.stopped_by or '-'} ({r.state})"
    return r.stopped_by or "-"


def render_status(rows: list[GroupStatus]) -> list[str]:
    """One row a group, named as `--group` wants it; the Auto Scaling group's name last."""
    lines = render.table(
        ["group", "min", "desired", "max", "in service", "stopped by", "previous desired",
         "Auto Scaling group"],
        [[group_label(r), str(r.min_size), str(r.desired_capacity), str(r.max_size), str(r.in_service),
          stopped_cell(r), "-" if r.previous_desired is None else str(r.previous_desired), r.name]
         for r in rows])
    failed = [r.name for r in rows if r.stop_failed]
    if failed:
        lines.append(f"stop failed on {', '.join(failed)}: still running; the guardrail retries, "
                     "or run `gpucluster stop` (see docs/guides/guard-state.md)")
    return lines


def render_getting_ready(rows: list[GroupStatus]) -> list[str]:
    """Groups with nodes still getting ready (not in service, not targeted by `run`), and for how long."""
    from gpucluster.ops.nodes import minutes

    return [f"{r.name}: {r.getting_ready} node(s) getting ready"
            + (f", the longest for {minutes(r.getting_ready_seconds)}" if r.getting_ready_seconds is not None
               else "") for r in rows if r.getting_ready]


def percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


BOOT_MEASURED = ("ready", "boot, as the nodes measured it (last 14 days; from each node's boot):")
BOOT_SLURM = ("registered", "boot, as Slurm recorded it (its current nodes; from each node's boot):")


def render_boot_times(rows: list[GroupBootTimes], error: str | None = None,
                      kind: tuple[str, str] = BOOT_MEASURED) -> list[str]:
    """Per group, as its nodes measured it over 14 days (or, `BOOT_SLURM`, as Slurm recorded its
    current nodes): time to ready (registered) and to the first job (median, worst, last, nodes), and
    each boot step's median moment; nothing while no node reported one."""
    from gpucluster.ops.nodes import minutes

    def cells(f: Figure | None) -> list[str]:
        if f is None:
            return ["-", "-", "-", "0"]
        return [minutes(f.median_seconds), minutes(f.worst_seconds), minutes(f.last_seconds), str(f.count)]

    if error:
        return render.wrap(error)
    measured = [r for r in rows if r.measured]
    if not measured:
        return []
    out = ["", kind[1],
           *render.table(["group", f"{kind[0]}: median", "worst", "last", "nodes", "first job: median",
                          "worst", "last", "nodes"],
                         [[r.node_group, *cells(r.time_to_ready), *cells(r.time_to_first_job)]
                          for r in measured])]
    for r in measured:
        if r.steps:
            out += render.wrap(f"{r.node_group} steps (median, seconds after boot): "
                               + ", ".join(f"{step} {f.median_seconds:.0f}" for step, f in r.steps.items()))
    return out


def render_health(rows: list[GroupStatus]) -> list[str]:
    """Per group: healthy of in service, GPU utilisation of the last 15 minutes, last replacement."""
    def replaced(r: GroupStatus) -> str:
        last = r.last_replacement
        return "-" if last is None else f"{last.time} {last.instance_id or '?'}: {last.reason}"

    return render.table(
        ["group", "healthy/in service", "gpu avg 15m", "gpu max 15m", "last health replacement"],
        [[group_label(r), f"{r.healthy}/{r.in_service}", percent(r.gpu_utilization_avg),
          percent(r.gpu_utilization_max), replaced(r)] for r in rows])


def render_spend(spend: dict[str, Any] | None, error: str | None) -> list[str]:
    """One line or two: spend so far, burn rate, when the limit is hit (the spend guard's view)."""
    if error:
        return render.wrap(f"spend: {error}")
    if spend is None:
        return []
    hours = spend["hours_to_limit"]
    if spend["over_limit"]:
        when = "limit reached"
    elif hours is None:
        when = "nothing burns: the limit is not reached at this rate"
    else:
        when = f"limit in {hours:,.1f} h ({spend['limit_at']} UTC)"
    lines = render.wrap(
        f"spend: ${spend['month_to_date_usd']:,.2f} this month (${spend['settled_usd']:,.2f} settled before "
        f"{spend['settled_through']} + ${spend['accrued_usd']:,.2f} accrued), burning "
        f"${spend['usd_per_hour']:,.2f}/h; limit ${spend['limit_usd']:,.2f}: {when}; spend guard "
        f"{spend['guard']}")
    for note in spend.get("notes", []):  # what the figure may miss: said, never shown as exact
        lines += render.wrap(f"note: {note}", indent="  ")
    return lines


def status_json(spec: StackSpec, overview: StackOverview) -> dict[str, Any]:
    """`status --json`: the same facts as the tables, one object per group."""
    document: dict[str, Any] = {
        "stack": spec.stack, "identity": spec.identity, "region": spec.region,
        "dashboard_url": overview.dashboard_url, "groups": [asdict(r) for r in overview.groups],
        "cost_tag_warning": overview.cost_tag_warning}
    if spec.observability.grafana.enabled:
        document["grafana_url"] = overview.grafana_url
    document["spend"], document["spend_error"] = overview.spend, overview.spend_error
    document["boot_times"] = [b.as_json() for b in overview.boot_times]
    document["boot_times_error"] = overview.boot_times_error
    if overview.maxima:  # an EKS stack only: groups that run with another maximum than configured
        document["maxima"] = [asdict(c) for c in overview.maxima]
    slurm, billed = still_billed_usd(spec)
    if slurm:  # a Slurm stack only: what it costs while every compute group is stopped
        document["still_billed_usd_per_month"] = billed if all_stopped(spec, overview) else None
    return document


def all_stopped(spec: StackSpec, overview: StackOverview) -> bool:
    """Every compute node group of the stack found and at zero (the login group is no compute group)."""
    compute = [r for r in overview.groups if r.node_group in {g.name for g in spec.node_groups}]
    return bool(compute) and all(r.desired_capacity == 0 and r.in_service == 0 for r in compute)


def status_lines(stack: str, spec: StackSpec, overview: StackOverview) -> list[str]:
    """`status` as text: the groups, nodes getting ready, GPU health and use, spend, dashboards."""
    rows, url, warning = overview.groups, overview.dashboard_url, overview.cost_tag_warning
    observed = spec.observability
    if not rows:
        out = render.wrap(f"stack {spec.stack} ({spec.region}): no Auto Scaling groups tagged "
                          f"gpucluster:stack={spec.identity} (not deployed, another account or region, "
                          "or deployed from another Pulumi organization or project)")
    else:
        out = [*render.wrap(f"stack {spec.stack} ({spec.region}), gpucluster:stack={spec.identity}:"),
               *render_status(rows), *render_getting_ready(rows), "", "GPU health and use:",
               *render_health(rows), *render_boot_times(overview.boot_times, overview.boot_times_error), "",
               *render_spend(overview.spend, overview.spend_error),
               f"dashboard: {url}"]  # a URL stays whole, however long
        if observed.grafana.enabled:
            out.append(f"grafana: {overview.grafana_url}" if overview.grafana_url else
                       "grafana: no Amazon Managed Grafana workspace tagged "
                       f"gpucluster:stack={spec.identity}")
        elif observed.prometheus.active:
            out.append(f"grafana dashboards: gpucluster dashboards export {stack} (for your own Grafana)")
    if rows and all_stopped(spec, overview):
        out += still_billed_lines(spec)
    for c in overview.maxima:
        out += [render.paint(line, "warn") for line in render.wrap(
            f"{c.group} runs with maximum {c.max_now}, not its configured {c.max_after} (max_nodes): "
            f"`gpucluster start {stack} --group {c.node_group or c.group}` sets it")]
    if warning:
        out += [render.paint(line, "warn") for line in render.wrap(warning)]
    return out


def status(stack: StackArg, as_json: JsonOption = False) -> None:
    """List the stack's node groups: capacity, who stopped them, GPU health and use, measured time to
    ready and to the first job, and the dashboard."""
    from gpucluster.ops.overview import stack_overview  # boto3: only the AWS commands pay for it

    render.use_json(as_json)
    spec = build_spec(stack)
    overview = ops_call("status", lambda: stack_overview(
        spec, clients=common.clients(spec), ce=common.cost_explorer(spec), progress=render.progress), None)
    if as_json:
        render.emit(status_json(spec, overview))
        raise typer.Exit(EXIT_OK)
    for line in status_lines(stack, spec, overview):
        render.echo(line)


def resume_price(spec: StackSpec, candidate: ResumeCandidate) -> tuple[str, pricing.Rate | None]:
    return node_group_rate(spec, candidate.node_group)


def node_group_rate(spec: StackSpec, node_group: str | None) -> tuple[str, pricing.Rate | None]:
    """(first instance type, USD per node-hour and its basis) of a node group, by name.

    The one node-hour price (pricing.node_hour_price): the group's purchase mix as `gpucluster
    cost` prices it. None when the group carries no node-group tag, the stack file no longer
    has that node group, or the region has no price.
    """
    group = next((g for g in spec.node_groups if g.name == node_group), None)
    if group is None or not group.types:
        return "?", None
    try:
        return group.types[0].name, pricing.node_hour_price(pricing.price_group(spec, group))
    except pricing.PricingError:
        return group.types[0].name, None


def resume_json(spec: StackSpec, candidate: ResumeCandidate) -> dict[str, Any]:
    """One group in `resume --json`: what resume would do to it, and its cost per hour if it does."""
    d = candidate.decision
    instance_type, rate = resume_price(spec, candidate)
    # on_demand_usd_per_hour keeps its name (scripts read it); it is priced as price_basis says.
    return {"group": d.group, "node_group": candidate.node_group, "action": d.action,
            "stopped_by": d.stopped_by, "reason": d.reason or None, "nodes_now": candidate.desired_now,
            "nodes_after": d.desired_capacity, "min_after": d.min_size, "instance_type": instance_type,
            "on_demand_usd_per_hour": None if rate is None or d.action != "resume"
            else round(rate.usd_per_hour * candidate.added_nodes, 4),
            "usd_per_node_hour": None if rate is None else round(rate.usd_per_hour, 4),
            "price_basis": None if rate is None else rate.basis}


def render_resume_plan(spec: StackSpec, todo: list[ResumeCandidate], action: str = "resume") -> list[str]:
    """What `resume` will restart, what it costs per hour, and the warning for budget stops."""
    rows, total, unpriced = [], 0.0, []
    prices: dict[str, pricing.Rate] = {}
    for c in todo:
        d = c.decision
        instance_type, rate = resume_price(spec, c)
        cost = None if rate is None else rate.usd_per_hour * c.added_nodes
        if cost is None:
            unpriced.append(c.group)
        else:
            total += cost
        if rate is not None:
            prices[c.node_group or c.group] = rate
        rows.append([c.group, c.node_group or "?", d.stopped_by or "-", str(c.desired_now),
                     str(d.desired_capacity), str(d.min_size), instance_type,
                     "?" if cost is None else usd(cost)])
    added = sum(c.added_nodes for c in todo)
    out = [f"stack {spec.stack} ({spec.region}): {action} restarts {len(todo)} group(s), "
           f"{added} node(s):"]
    out += render.table(["group", "node group", "stopped by", "nodes now", "nodes after", "min after",
                         "instance type", "$/h"], rows)
    bound = "at least " if unpriced else ""
    out.append(f"cost: {bound}${usd(total)}/hour (${usd(total * 24)}/day), priced as `gpucluster cost` "
               "prices each group:")
    out += render.node_hour_lines(prices)
    if unpriced:
        out.append(f"  not priced: {', '.join(unpriced)} (no gpucluster:node-group tag, a node group "
                   f"no longer in the stack file, or no price for {spec.region})")
    budget_stopped = [c.group for c in todo if c.decision.stopped_by == "budget"]
    if budget_stopped:
        limit = f" (${spec.budget.monthly_limit_usd:,.0f}/month)" if spec.budget else ""
        out += [f"warning: {', '.join(budget_stopped)} {'was' if len(budget_stopped) == 1 else 'were'} "
                f"stopped by the budget action{limit}. Resuming undoes it, and the budget",
                "  action does not fire again this month (AWS Budgets alerts once per threshold per "
                "month):",
                "  until the month ends only idle, schedule and lifetime stops still apply. To keep the",
                "  budget stop, resume with --only idle/schedule/lifetime; or raise "
                "budget.monthly_limit_usd first."]
    return out


def restored_lines(todo: list[ResumeCandidate], results: list[ResumeResult], verb: str) -> list[str]:
    """What `resume` or `start` (`verb`: resumed, started) did to each group, from its nodes before."""
    before = {c.group: c.desired_now for c in todo}
    return [f"{verb} {r.group} (stopped by {r.stopped_by}): {before.get(r.group, 0)} -> "
            f"{r.desired_capacity} node(s), min {r.min_size}" if r.action == "resumed"
            else f"not {verb} {r.group}: {r.reason}" for r in results]


def explain_nothing_to_resume(stack: str, spec: StackSpec, candidates: list[ResumeCandidate],
                              only: list[str]) -> list[str]:
    """Why `resume` has nothing to do, per group, and what to do instead."""
    from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, STOPPED_BY_TAG

    if not candidates:
        return [*render.wrap(f"nothing to resume: no Auto Scaling group is tagged "
                             f"gpucluster:stack={spec.identity} in {spec.region}."),
                *render.wrap(f"Not deployed yet (pulumi up -s {spec.stack}), or your AWS credentials "
                             "point at another account (check AWS_PROFILE), or it was deployed from "
                             "another Pulumi organization or project (gpucluster:organization, the "
                             "name in Pulumi.yaml).", "  ")]
    out = [f"nothing to resume in stack {spec.stack} ({spec.region}):"]
    for c in candidates:
        d = c.decision
        if d.stopped_by is None and c.desired_now:
            out.append(f"  {d.group}: running ({c.desired_now} desired), not stopped by a guardrail")
        elif d.stopped_by is None:
            out.append(f"  {d.group}: at 0 nodes by its own settings, not stopped by a guardrail; to "
                       f"start nodes: aws autoscaling set-desired-capacity --auto-scaling-group-name "
                       f"{d.group} --desired-capacity N")
        elif only and d.stopped_by not in only:
            out.append(f"  {d.group}: stopped by {d.stopped_by}, which --only {','.join(only)} leaves "
                       f"alone; to restart it: gpucluster resume {stack} --only {d.stopped_by}")
        else:
            out.append(f"  {d.group}: stopped by {d.stopped_by}, but the capacity to restore (tag "
                       f"{PREVIOUS_DESIRED_TAG}) is missing or invalid; restore it by hand: aws "
                       f"autoscaling update-auto-scaling-group --auto-scaling-group-name {d.group} "
                       f"--min-size N --desired-capacity N, then delete its {STOPPED_BY_TAG} tag")
    return out


def resume_document(spec: StackSpec, plan: RestorePlan, dry_run: bool,
                    outcome: ResumeOutcome | None = None) -> dict[str, Any]:
    """`resume --json`: every group and what resume does to it; what it did and the status after."""
    return head(spec, dry_run=dry_run, groups=[resume_json(spec, c) for c in plan.candidates],
                resumed=[] if outcome is None else [asdict(r) for r in outcome.results],
                status=[] if outcome is None else [asdict(r) for r in outcome.status])


def resume(
    stack: StackArg,
    only: Annotated[list[str] | None, typer.Option(
        "--only", help="Resume only groups stopped for this reason (budget, idle, schedule, "
                       "lifetime, manual); repeatable.")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (scripts).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Only show what would restart and its cost.")]
    = False,
    as_json: JsonOption = False,
) -> None:
    """Restart the groups a guardrail stopped: shows them and their cost per hour, asks, then restores.

    With --json it cannot ask: give --yes (resume) or --dry-run (only show).
    """
    from gpucluster.fleet.nodegroups import STOP_REASONS
    from gpucluster.ops.resume import apply_resume, plan_resume

    render.use_json(as_json)
    if as_json and not (yes or dry_run):
        fail_usage("resume", "--json cannot ask for confirmation: add --yes to resume, or --dry-run")
    spec = build_spec(stack)
    unknown = sorted(set(only or []) - set(STOP_REASONS))
    if unknown:
        fail_usage("resume", f"--only: unknown reason {', '.join(unknown)} "
                             f"(one of {', '.join(STOP_REASONS)})")
    plan = ops_call("resume", lambda: plan_resume(spec, common.clients(spec), only or None),
                    f"reading {spec.stack}'s Auto Scaling groups in {spec.region}")
    todo = plan.todo
    if not as_json:
        lines = (explain_nothing_to_resume(stack, spec, plan.candidates, only or []) if not todo
                 else [*render_resume_plan(spec, todo), *(["dry run: nothing changed"] if dry_run else [])])
        for line in lines:
            render.say(line)
    if not todo or dry_run:
        if as_json:
            render.emit(resume_document(spec, plan, dry_run))
        raise typer.Exit(EXIT_OK)
    confirm_or_exit("resume", f"Restart {len(todo)} group(s)?", yes)
    outcome = ops_call("resume", lambda: apply_resume(plan), f"restarting {len(todo)} group(s)")
    if as_json:
        render.emit(resume_document(spec, plan, dry_run, outcome))
        raise typer.Exit(EXIT_OK)
    for line in [*restored_lines(todo, outcome.results, "resumed"), *render_status(outcome.status)]:
        render.say(line)


def ago(when: datetime | None) -> str:
    if when is None:
        return "-"
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


# ------------------------------------------------------------------------- nodes


def render_nodes(nodes: list[Node]) -> list[str]:
    metrics = any(n.metrics is not None for n in nodes)  # the column only with observability.prometheus
    return render.table(
        ["instance", "node group", "type", "GPUs", "slots", "zone", "private IP", "lifecycle", "state",
         "health", "launched (UTC)", "SSM", "ready", *(["metrics"] if metrics else [])],
        [[n.instance_id, n.node_group, n.instance_type, str(n.gpus),
          f"{n.slots} MIG" if n.mig_per_gpu else str(n.slots), n.zone, n.private_ip or "-",
          n.lifecycle, f"{n.state}/{n.asg_state}", n.health, ago(n.launch_time), n.ssm, n.readiness,
          *([n.metrics or "-"] if metrics else [])]
         for n in nodes])


def nodes(
    stack: StackArg,
    group: GroupOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the stack's nodes: id, group, type, zone, private IP, market, state, health, SSM, readiness;
    then each group's measured time to ready and to the first job (median, worst, last)."""
    from gpucluster.ops.boottimes import slurm_boot_times, stack_boot_times
    from gpucluster.ops.jobbackends import SchedulerNodes, job_backend

    render.use_json(as_json)
    spec = build_spec(stack)
    clients = common.clients(spec)
    jobs = job_backend(spec, clients)
    found = ops_call("nodes", lambda: jobs.nodes(group, progress=render.progress), None)
    if isinstance(found, SchedulerNodes):  # Slurm's own record: registration and first job
        boots: tuple[list[GroupBootTimes], str | None] = (slurm_boot_times(found.views), None)
    else:
        with render.progress("reading the nodes' boot times (CloudWatch)"):
            boots = stack_boot_times(spec, clients("cloudwatch"), node_group=group, steps=True)
    if as_json:
        nodes_json(spec, found, boots)
    else:
        nodes_text(spec, stack, group, found)
        for line in render_boot_times(*boots, kind=BOOT_SLURM if isinstance(found, SchedulerNodes)
                                      else BOOT_MEASURED):
            render.say(line)


def nodes_json(spec: StackSpec, found: Any,
               boots: tuple[list[GroupBootTimes], str | None] = ([], None)) -> None:
    """`nodes --json`: each node (a scheduler's: beside the instance behind it), and each node group's
    boot as its nodes measured it (`boot_times`; `boot_times_error` when CloudWatch could not be read)."""
    from gpucluster.ops.jobbackends import SchedulerNodes

    measured = {"boot_times": [b.as_json() for b in boots[0]], "boot_times_error": boots[1]}
    if isinstance(found, SchedulerNodes):
        render.emit(head(spec, scheduler=found.scheduler_name, nodes=[v.as_json() for v in found.views],
                         **measured))
        return
    render.emit(head(spec, nodes=[n.as_json() for n in found], **measured))


def nodes_text(spec: StackSpec, stack: str, group: str | None, found: Any) -> None:
    """`nodes`: a line of totals, then a table of the nodes."""
    from gpucluster.ops.jobbackends import SchedulerNodes

    if isinstance(found, SchedulerNodes):
        views = found.views
        known = [v for v in views if v.slurm is not None]
        running = sum(1 for v in views if v.as_json()["ec2_state"] == "running")
        render.say(f"stack {spec.stack} ({spec.region}), Slurm: {len(known)} Slurm node(s)"
                   f"{f' in partition {group}' if group else ''}, {running} running instance(s) "
                   "(a Slurm node with no instance is powered down: PCS launches it for a job)")
        for line in render.slurm_node_lines(views):
            render.say(line)
        return
    if not found:
        render.say(f"stack {spec.stack} ({spec.region}): no nodes"
                   + (f" in node group {group}" if group else "")
                   + f" (groups tagged gpucluster:stack={spec.identity} run none; "
                     f"see `gpucluster status {stack}`)")
        return
    waiting = sum(n.getting_ready for n in found)
    render.say(f"stack {spec.stack} ({spec.region}): {len(found)} node(s), "
               f"{sum(n.in_service for n in found)} in service"
               + (f", {waiting} getting ready (not targeted until ready)" if waiting else ""))
    for line in render_nodes(found):
        render.say(line)


# ------------------------------------------------------------------ scale / stop / start


@dataclass(frozen=True)
class PricedChanges:
    """`scale`'s plan priced: table rows, dollars an hour after, changes for `--json`, node-hour prices."""

    rows: list[list[str]]
    total: float
    changes: list[dict[str, Any]]
    prices: dict[str, pricing.Rate]


def priced_changes(spec: StackSpec, plan: ScalePlan) -> PricedChanges:
    """`scale`'s table rows, the cost per hour after, each change priced for `--json`, and the node-hour
    price of each node group (`pricing.node_hour_price`, as `cost` prices it)."""
    rows, total, priced = [], 0.0, []
    prices: dict[str, pricing.Rate] = {}
    for c in plan.changes:
        instance_type, rate = node_group_rate(spec, c.node_group)
        cost = None if rate is None else rate.usd_per_hour * c.desired_after
        total += cost or 0.0
        if rate is not None:
            prices[c.node_group] = rate
        rows.append([c.group, c.node_group, str(c.desired_now), str(c.desired_after),
                     f"{c.min_now} -> {c.min_after}", instance_type, "?" if cost is None else usd(cost)])
        priced.append({**asdict(c), "instance_type": instance_type,
                       "on_demand_usd_per_hour_after": None if cost is None else round(cost, 4),
                       "usd_per_node_hour": None if rate is None else round(rate.usd_per_hour, 4),
                       "price_basis": None if rate is None else rate.basis})
    return PricedChanges(rows, total, priced, prices)


def scale_plan_lines(spec: StackSpec, plan: ScalePlan, priced: PricedChanges, dry_run: bool) -> list[str]:
    """What `scale` will change, what it costs per hour, and why nothing changes (when nothing does)."""
    out = [f"stack {spec.stack} ({spec.region}): scale {plan.group} to {plan.desired} node(s):",
           *render.table(["group", "node group", "nodes now", "nodes after", "min", "instance type",
                          "$/h after"], priced.rows)]
    if plan.added_nodes:
        out.append(f"cost: ${usd(priced.total)}/hour (${usd(priced.total * 24)}/day), priced as "
                   "`gpucluster cost` prices each group:")
        out.extend(render.node_hour_lines(priced.prices))
    if plan.unchanged or dry_run:
        out.append("nothing to change" if plan.unchanged else "dry run: nothing changed")
    return out


def scale(
    stack: StackArg,
    group: RequiredGroup = "",
    desired: Annotated[int | None, typer.Option("--desired", help="Nodes the group should run.")] = None,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
) -> None:
    """Set a node group's desired nodes (within its max_nodes); shows the cost per hour, asks first.

    With --json it cannot ask: adding nodes (or fewer than now) needs --yes, or --dry-run.
    """
    from gpucluster.ops.scale import apply_scale, plan_scale

    render.use_json(as_json)
    if not group:
        fail_usage("scale", "--group is required")
    if desired is None:
        fail_usage("scale", "--desired is required")
    spec = build_spec(stack)
    from gpucluster.ops.slurmjobs import refusal

    if (reason := refusal(spec, "scale")) is not None:
        fail_usage("scale", reason)
    plan = ops_call("scale", lambda: plan_scale(spec, common.clients(spec), group, desired),
                    f"reading {spec.stack}'s Auto Scaling groups in {spec.region}")
    priced = priced_changes(spec, plan)
    document = head(spec, group=group, desired=desired, changes=priced.changes, dry_run=dry_run,
                    changed=not plan.unchanged and not dry_run, results=[])
    if not as_json:
        for line in scale_plan_lines(spec, plan, priced, dry_run):
            render.say(line)
    if plan.unchanged or dry_run:
        if as_json:
            render.emit(document)
        return
    if plan.added_nodes or desired < min(c.desired_now for c in plan.changes):
        confirm_or_exit("scale", f"Scale {group} to {desired} node(s)?", yes)
    outcome = ops_call("scale", lambda: apply_scale(plan), f"scaling {group} to {desired} node(s)")
    if as_json:
        render.emit({**document, "results": [asdict(r) for r in outcome.results]})
    else:
        for r in outcome.results:
            render.say(f"scaled {r.group} to {desired} node(s)" if r.action == "scaled"
                       else f"not scaled {r.group}: {r.reason}")
    if any(r.action != "scaled" for r in outcome.results):
        raise typer.Exit(EXIT_BLOCKED)


def stop_document(spec: StackSpec, plan: StopPlan, dry_run: bool,
                  outcome: StopOutcome | None = None) -> dict[str, Any]:
    """`stop --json`: the selection and what stops; the hook's result, each group's outcome, the status."""
    document = head(spec, group=plan.group, groups=[asdict(c) for c in plan.candidates],
                    to_stop=[c.group for c in plan.running], pre_stop_command=plan.pre_stop_command,
                    dry_run=dry_run)
    if outcome is None:
        return {**document, "stopped": {}, "errors": {}, "hook": None, "status": []}
    report = outcome.report
    hook_json = None if report.hook is None else {
        "ok": report.hook.ok, "timed_out": report.hook.timed_out, "statuses": report.hook.statuses,
        "errors": report.hook.errors}
    return {**document, "stopped": report.outcomes, "errors": report.errors, "hook": hook_json,
            "status": [asdict(r) for r in outcome.status]}


def nothing_to_stop_lines(spec: StackSpec, plan: StopPlan) -> list[str]:
    """Why `stop` has nothing to do, per group."""
    out = [f"nothing to stop in stack {spec.stack} ({spec.region})"
           + (f", node group {plan.group}" if plan.group else "") + ":"]
    for c in plan.candidates:
        why = f"stopped by {c.stopped_by}" if c.stopped_by else "at 0 nodes by its own settings"
        out.append(f"  {c.group}: {why}")
    if not plan.candidates:
        out.append(f"  no Auto Scaling group is tagged gpucluster:stack={spec.identity}")
    return [*out, *still_billed_lines(spec)]


def still_billed_usd(spec: StackSpec) -> tuple[bool, float | None]:
    """(whether the stack costs something while stopped: a Slurm stack, what a month: pricing.
    stopped_slurm_costs; None where the region has no PCS prices)."""
    try:
        costs = pricing.stopped_slurm_costs(spec)
    except pricing.PricingError:
        return True, None
    return bool(costs), round(sum(c.desired_usd_per_month for c in costs), 2) if costs else None


def still_billed_lines(spec: StackSpec) -> list[str]:
    """On a Slurm stack, what no stop touches and what it costs a month (pricing.stopped_slurm_costs: the
    AWS PCS figures are unverified, as `gpucluster cost` says; ledger: pcs-prices); nothing on a type-none
    stack."""
    try:
        costs = pricing.stopped_slurm_costs(spec)
    except pricing.PricingError as err:
        return [f"still billed while stopped: the AWS PCS controller, accounting and login nodes ({err})"]
    if not costs:
        return []
    total = sum(c.desired_usd_per_month for c in costs)
    parts = ", ".join(f"{c.name.removeprefix('AWS PCS ')} ${c.desired_usd_per_month:,.0f}" for c in costs)
    caveat = "AWS PCS prices unverified, see `gpucluster cost`"  # ledger: pcs-prices
    return render.wrap(f"still billed while stopped: about ${total:,.0f} a month ({parts}; {caveat}): the "
                       "cluster and its login nodes run until the stack is destroyed", hang="  ")


def stop_plan_lines(spec: StackSpec, plan: StopPlan) -> list[str]:
    """What `stop` is about to do: the groups, their nodes, the hook, what is erased."""
    running, hook = plan.running, plan.pre_stop_command
    return [f"stack {spec.stack} ({spec.region}): stop {len(running)} group(s), "
            f"{sum(c.desired_now for c in running)} node(s):",
            *render.table(["group", "node group", "nodes now", "in service"],
                          [[c.group, c.node_group, str(c.desired_now), str(c.in_service)] for c in running]),
            f"pre-stop hook first: {hook} (waits at most {spec.autostop.pre_stop_timeout_seconds} s)"
            if hook else "no pre-stop hook (autostop.pre_stop_command): running jobs stop as they are",
            "instance-store scratch is erased; S3 and FSx data are untouched",
            *still_billed_lines(spec)]


def stopped_lines(outcome: StopOutcome) -> list[str]:
    """What `stop` did: the hook's result, each group's outcome or error, then the status after."""
    report, out = outcome.report, []
    if report.hook is not None:
        failed = ", ".join(f"{i} ({s})" for i, s in report.hook.failed.items())
        timed_out = " (timed out)" if report.hook.timed_out else ""
        out.append("pre-stop hook: " + ("ok on every node" if report.hook.ok
                                        else f"did not succeed on {failed}{timed_out}"))
    out += [f"{name}: {result}" for name, result in report.outcomes.items()]
    out += [f"{name}: not stopped: {error}" for name, error in report.errors.items()]
    return [*out, *render_status(outcome.status)]


def stop(
    stack: StackArg,
    group: GroupOption = None,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
) -> None:
    """Stop node groups (all, or one): runs the pre-stop hook on their nodes, then scales to zero.

    Recorded as stopped-by `manual`: `status` shows it, `start` or `resume` restore the
    capacity, schedules leave it alone, and a budget stop still outranks it. With --json it
    cannot ask: give --yes, or --dry-run.
    """
    from gpucluster.ops.stopstart import apply_stop, plan_stop

    render.use_json(as_json)
    spec = build_spec(stack)
    plan = ops_call("stop", lambda: plan_stop(spec, common.clients(spec), group),
                    f"reading {spec.stack}'s Auto Scaling groups in {spec.region}")
    running = plan.running
    if as_json and (not running or dry_run):
        render.emit(stop_document(spec, plan, dry_run))
        return
    if not as_json:
        for line in stop_plan_lines(spec, plan) if running else nothing_to_stop_lines(spec, plan):
            render.say(line)
    if not running:
        return
    if dry_run:
        render.say("dry run: nothing changed")
        return
    confirm_or_exit("stop", f"Stop {len(running)} group(s)?", yes)
    doing = f"running the pre-stop hook on {len(running)} group(s), then " if plan.pre_stop_command else ""
    outcome = ops_call("stop", lambda: apply_stop(plan), f"{doing}scaling {len(running)} group(s) to zero")
    if as_json:
        render.emit(stop_document(spec, plan, dry_run, outcome))
    else:
        for line in stopped_lines(outcome):
            render.say(line)
    raise typer.Exit(EXIT_BLOCKED if outcome.report.errors else EXIT_OK)


def start_lines(stack: str, spec: StackSpec, plan: RestorePlan, dry_run: bool) -> list[str]:
    """What `start` will restart and its cost, budget stops it leaves alone, or why nothing starts."""
    from gpucluster.fleet.nodegroups import BUDGET

    out = [f"{c.group}: stopped by the budget action; start leaves it stopped "
           f"(`gpucluster resume {stack} --only budget` undoes it, with its warning)"
           for c in plan.candidates if c.decision.stopped_by == BUDGET]
    maxima = [f"{c.group}: runs with maximum {c.max_now}; start sets its configured {c.max_after} "
              "(max_nodes, from its gpucluster:max-nodes tag)" for c in plan.maxima]
    if not plan.todo and maxima:
        return [*out, *maxima, *(["dry run: nothing changed"] if dry_run else [])]
    if not plan.todo:
        return [*out, f"nothing to start in stack {spec.stack} ({spec.region})"
                + (f", node group {plan.group}" if plan.group else "")
                + ": no group stopped by manual, idle, schedule or lifetime"
                + (f" (`gpucluster scale {stack} --group G --desired N` for a group at 0 by "
                   "its own settings)" if plan.candidates else "")]
    return [*out, *render_resume_plan(spec, plan.todo, action="start"), *maxima,
            *(["dry run: nothing changed"] if dry_run else [])]


def start(
    stack: StackArg,
    group: GroupOption = None,
    yes: YesOption = False,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
) -> None:
    """Restart stopped node groups (all, or one) at their recorded capacity; never a budget stop.

    On an EKS stack it also sets the configured maximum (max_nodes) of the groups that run: Pulumi
    sets an EKS group's maximum only when it creates the group. With --json it cannot ask: give
    --yes, or --dry-run.
    """
    from gpucluster.ops.stopstart import apply_start, plan_start

    render.use_json(as_json)
    spec = build_spec(stack)
    plan = ops_call("start", lambda: plan_start(spec, common.clients(spec), group),
                    f"reading {spec.stack}'s Auto Scaling groups in {spec.region}")
    todo, maxima = plan.todo, plan.maxima
    document = head(spec, group=group, dry_run=dry_run,
                    groups=[resume_json(spec, c) for c in plan.candidates], started=[])
    if maxima:  # an EKS stack only: the key is absent elsewhere
        document["maxima"] = [asdict(c) for c in maxima]
    if as_json and ((not todo and not maxima) or dry_run):
        render.emit(document)
        return
    if not as_json:
        for line in start_lines(stack, spec, plan, dry_run):
            render.say(line)
        if (not todo and not maxima) or dry_run:
            return
    question = (f"Restart {len(todo)} group(s)?" if not maxima else
                f"Restart {len(todo)} group(s) and set the maximum of {len(maxima)}?")
    confirm_or_exit("start", question, yes)  # --json: --yes or exit 2
    outcome = ops_call("start", lambda: apply_start(plan), f"restarting {len(todo)} group(s)")
    if as_json:
        extra = {"maxima_set": [asdict(r) for r in outcome.maxima]} if maxima else {}
        render.emit({**document, "started": [asdict(r) for r in outcome.results], **extra})
    else:
        for line in restored_lines(todo, outcome.results, "started"):
            render.say(line)
        after = {c.group: c for c in maxima}
        for r in outcome.maxima:
            c = after[r.group]
            render.say(f"maximum of {r.group}: {c.max_now} -> {c.max_after}" if r.action == "set"
                       else f"maximum of {r.group} not set: {r.reason}")
    failed = (any(r.action != "resumed" for r in outcome.results)
              or any(r.action != "set" for r in outcome.maxima))
    raise typer.Exit(EXIT_BLOCKED if failed else EXIT_OK)
