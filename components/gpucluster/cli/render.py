"""How every command prints: plain lines that fit 100 columns or one JSON document, errors alike.

It owns the output conventions of the `gpucluster` command, so each command
only decides *what* to say: `--json` mode (a command calls `use_json` first, and
from then on a failure prints `{"errors": [{"path": ..., "message": ...}]}` on
stdout instead of lines on stderr, with the same exit code), colour for what a
reader must not miss (mandatory violations and blockers red, warnings yellow,
savings and clean verdicts green; off when the stream is not a terminal, with
`NO_COLOR`, or `TERM=dumb`; `FORCE_COLOR` turns it on), lines wrapped to
`WIDTH`, tables, and a spinner on stderr for AWS calls that take more than a
second. It never decides exit codes on its own and never imports boto3 or
Pulumi (`rich` only for the spinner, when one is shown).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from gpucluster.ops.slurmjobs import NodeView
    from gpucluster.plan import Plan, PlannedResource
    from gpucluster.policy.records import Violation
    from gpucluster.pricing import Rate, StackCost
    from gpucluster.slurm.queue import SlurmJob
    from gpucluster.slurm.usage import UsageRow

WIDTH = 100
"""Every human line fits a 100-column terminal."""

_STYLES = {"bad": "1;31", "warn": "33", "good": "32", "dim": "2", "bold": "1"}
_state = {"json": False, "lines": False}


# --------------------------------------------------------------------- JSON mode


def use_json(on: bool, lines: bool = False) -> None:
    """Set by a command before it can fail: errors then come as one JSON document on stdout.

    `lines`: the command streams JSON Lines (`logs --follow --json`), so every document, errors
    included, is printed on one line.
    """
    _state["json"], _state["lines"] = bool(on), bool(on and lines)


def json_mode() -> bool:
    return _state["json"]


def emit(document: Any) -> None:
    """One JSON document on stdout (what `--json` prints): indented, or one line in JSON Lines mode."""
    if _state["lines"]:
        typer.echo(json.dumps(document, separators=(",", ":")))
    else:
        typer.echo(json.dumps(document, indent=2))


def fail(problems: Sequence[tuple[str | None, str]], code: int, title: str | None = None) -> NoReturn:
    """Every problem as `path: message` (or just the message), then exit with `code`.

    In JSON mode: `{"errors": [{"path": ..., "message": ...}]}` on stdout, nothing else.
    """
    if json_mode():
        emit({"errors": [{"path": path, "message": message} for path, message in problems]})
    else:
        if title:
            typer.echo(title, err=True)
        for path, message in problems:
            typer.echo(f"{path}: {message}" if path else message, err=True)
    raise typer.Exit(code)


def split_problem(line: str) -> tuple[str | None, str]:
    """`where: what` -> (where, what); a line without a location -> (None, line)."""
    where, sep, what = line.partition(": ")
    return (where, what) if sep and where and " " not in where.strip("`") else (None, line)


# ----------------------------------------------------------------------- colour


def colour_on(stream: IO[str] | None = None) -> bool:
    """Colour for `stream` (stdout): a terminal, unless NO_COLOR or TERM=dumb; FORCE_COLOR forces it."""
    if os.environ.get("NO_COLOR"):  # no-color.org: set and not empty
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM") == "dumb":
        return False
    stream = stream or sys.stdout
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a file
        return False


def paint(text: str, style: str, err: bool = False) -> str:
    """`text` in one of the styles (bad, warn, good, dim, bold) when colour is on for that stream."""
    if not text or not colour_on(sys.stderr if err else sys.stdout):
        return text
    return f"\033[{_STYLES[style]}m{text}\033[0m"


def echo(line: str = "", err: bool = False) -> None:
    """Print one line; ANSI styles pass through when colour is on (click strips them otherwise)."""
    typer.echo(line, err=err, color=colour_on(sys.stderr if err else sys.stdout))


# ----------------------------------------------------------------------- layout


def wrap(text: str, indent: str = "", width: int = WIDTH, hang: str = "  ") -> list[str]:
    """`text` as lines of at most `width` columns: the first indented by `indent`, the rest by more."""
    return textwrap.wrap(text, width=width, initial_indent=indent, subsequent_indent=indent + hang,
                         break_long_words=True, break_on_hyphens=False) or [indent]


def table(headers: list[str], rows: list[list[str]], indent: str = "  ", width: int = WIDTH,
          min_wrap: int | None = None) -> list[str]:
    """Columns padded to their widest cell; cells that look like numbers are right-aligned.

    A table wider than `width` keeps as many leading columns as fit and prints the rest of each
    row under it, indented, as `header: value` (a long last column of text, such as a finding,
    wraps in its own column instead, at least `min_wrap` wide when given, else under its row,
    indented): every line fits `width`.
    """
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def numeric(cell: str) -> bool:
        return cell.lstrip("$+-").replace(",", "").replace(".", "", 1).replace(" %", "").isdigit()

    def line(cells: list[str], upto: int) -> str:
        return indent + "  ".join(c.rjust(w) if numeric(c) else c.ljust(w)
                                  for c, w in zip(cells[:upto], widths[:upto], strict=True)).rstrip()

    def span(columns: int) -> int:
        return len(indent) + sum(widths[:columns]) + 2 * (columns - 1)

    if span(len(headers)) <= width:
        return [line(headers, len(headers)), *(line(r, len(headers)) for r in rows)]
    last = len(headers) - 1
    text_last = all(not numeric(str(r[last])) for r in rows)
    if span(last) + 2 + (min_wrap or 24) <= width and text_last:
        room = width - span(last) - 2  # the last column wraps within what is left
        pad = " " * (span(last) + 2)
        out = [line(headers, last).ljust(span(last)) + "  " + headers[last]]
        for r in rows:
            parts = textwrap.wrap(str(r[last]), room, break_on_hyphens=False) or [""]
            out += [(line(r, last).ljust(span(last)) + "  " + parts[0]).rstrip(),
                    *(pad + p for p in parts[1:])]
        return out
    if text_last and min_wrap is not None and span(last) <= width:
        under = indent + " " * (widths[0] + 4)  # deeper than a row: the second column, and then some
        out = [line(headers, last) + "  " + headers[last]]
        for r in rows:
            out += [line(r, last), *wrap(str(r[last]), indent=under, width=width, hang="")]
        return out
    keep = max(c for c in range(1, len(headers) + 1) if c == 1 or span(c) <= width)
    out = [line(headers, keep)]
    for r in rows:
        out.append(line(r, keep))
        rest = "  ".join(f"{h}: {c}" for h, c in zip(headers[keep:], r[keep:], strict=True))
        out += wrap(rest, indent=indent + "    ", width=width)
    return out


def wrap_lines(lines: Iterable[str], width: int = WIDTH) -> list[str]:
    """Prose lines wrapped to `width`; a line's leading spaces indent all it wraps into."""
    out: list[str] = []
    for text in lines:
        for part in text.split("\n"):
            body = part.lstrip(" ")
            out += wrap(body, indent=part[: len(part) - len(body)], width=width)
    return out


def yaml_lines(text: str, indent: str = "  ", width: int = WIDTH) -> list[str]:
    """A YAML snippet to paste, indented; a comment longer than `width` goes on as more comment
    lines (the same YAML), nothing else is touched."""
    out = []
    for line in text.splitlines():
        body = line.lstrip(" ")
        if body.startswith("#") and len(indent + line) > width:
            lead = indent + line[: len(line) - len(body)]
            out += wrap(body.removeprefix("#").strip(), indent=lead + "# ", width=width, hang="")
        else:
            out.append(indent + line)
    return out


def say(text: str, err: bool = False, width: int = WIDTH) -> None:
    """Print prose wrapped to `width` (see `wrap_lines`)."""
    for line in wrap_lines([text], width):
        echo(line, err=err)


def grid(cells: Iterable[str], indent: str = "  ", width: int = WIDTH, gap: int = 3) -> list[str]:
    """Short cells in as many columns as fit `width`, filled column by column (like `ls`)."""
    items = list(cells)
    for columns in range(len(items), 0, -1):
        rows = -(-len(items) // columns)
        table = [column for c in range(columns) if (column := items[c * rows:(c + 1) * rows])]
        widths = [max(len(cell) for cell in column) for column in table]
        if len(indent) + sum(widths) + gap * (len(widths) - 1) <= width or columns == 1:
            pairs = list(zip(table, widths, strict=True))
            return [indent + (" " * gap).join(column[r].ljust(w) for column, w in pairs if r < len(column))
                    .rstrip() for r in range(rows)]
    return []


def summarise(value: Any, indent: str = "  ", width: int = WIDTH) -> list[str]:
    """A nested JSON value as `key: value` lines, nested keys indented, wrapped at `width`."""
    out: list[str] = []

    def walk(key: str, item: Any, depth: int) -> None:
        pad = indent + "  " * depth
        if isinstance(item, dict) and item:
            out.append(f"{pad}{key}:")
            for k, v in item.items():
                walk(str(k), v, depth + 1)
            return
        if isinstance(item, dict):
            text = "-"
        elif isinstance(item, list) and all(not isinstance(v, dict | list) for v in item):
            text = ", ".join(_scalar(v) for v in item) or "-"
        elif isinstance(item, list):
            text = f"{len(item)} items"
        else:
            text = _scalar(item)
        out.extend(wrap(f"{key}: {text}", indent=pad, width=width, hang="    "))

    for key, item in (value.items() if isinstance(value, dict) else [("value", value)]):
        walk(str(key), item, 0)
    return out


def _scalar(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


# --------------------------------------------------------------------------- plan


def kind(type_token: str) -> str:
    """`aws:ec2/securityGroup:SecurityGroup` -> `ec2.SecurityGroup`; `gpucluster:index:GpuCluster` ->
    `gpucluster.GpuCluster`."""
    package, _, rest = type_token.partition(":")
    module, _, name = rest.rpartition(":")
    module = module.split("/")[0]
    return f"{package if module in ('index', '') else module}.{name}"


def plan_lines(result: Plan, cost: StackCost | str, violations: list[Violation], tree: bool,
               notes: Sequence[str] = (), warnings: Sequence[str] = ()) -> list[str]:
    """`gpucluster plan` at a glance: one line per node group (what runs where, at what price), the
    verdict (cost, policies), then each problem in full (violations, warnings, notes, wrapped, never
    cut); `--tree` adds the resource kinds, the resource tree and the stack outputs.

    `warnings`: the spec's advice (valid config against it), each `path: message`.
    """
    custom = [r for r in result.resources if r.custom]
    spec = result.spec
    out = [paint(f"stack {result.stack} ({spec.region}): {len(spec.node_groups)} node group(s), "
                 f"{len(custom)} resources in {len(result.resources) - len(custom)} components", "bold")]
    out += node_group_lines(result, cost)
    out += slurm_lines(result)
    out += eks_lines(result, cost)
    out += cost_lines(result.stack, cost)
    out += violation_lines(violations)
    for warning in warnings:  # valid, but against advice (e.g. spot in a multi-node EFA group)
        out += [paint(line, "warn") for line in wrap(f"warning: {warning}")]
    for note in notes:
        out += [paint(line, "warn") for line in wrap(f"note: {note}")]
    if tree:
        counts: dict[str, int] = {}
        for r in custom:
            counts[kind(r.type)] = counts.get(kind(r.type), 0) + 1
        out += ["", "resources by kind:"]
        out += grid(f"{n:3d} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
        out += ["", "resource tree:"]
        for line in tree_lines(result.resources):
            depth = len(line) - len(line.lstrip())
            out += wrap(line.lstrip(), indent=" " * (depth + 2), hang="    ")
        out += ["", "outputs:", *summarise(result.outputs)]
    else:
        out.append(paint("(--tree: the resources by kind, the resource tree and the stack outputs)", "dim"))
    return out


def slurm_lines(result: Plan) -> list[str]:
    """A Slurm stack's AWS PCS cluster as planned: the Slurm version, size and accounting, the queues
    (one per node group, each its partition) and the login group; nothing on a `type: none` stack."""
    # The cluster is a Cloud Control resource: its AWS::PCS::Cluster document, CloudFormation's names.
    clusters = [json.loads(r.inputs.get("desiredState") or "{}")
                for r in result.of_type("aws:cloudcontrol/resource:Resource")
                if r.inputs.get("typeName") == "AWS::PCS::Cluster"]
    if not clusters:
        return []
    document = clusters[0]
    accounting = document.get("SlurmConfiguration", {}).get("Accounting", {}).get("Mode") == "STANDARD"
    queues = sorted(q.inputs.get("name", q.name) for q in result.of_type("aws-native:pcs:Queue"))
    queued = set(queues)
    others = [g.inputs for g in result.of_type("aws-native:pcs:ComputeNodeGroup")
              if g.inputs.get("name") not in queued]
    login = ", ".join(f"{g.get('name')} {g.get('scalingConfiguration', {}).get('minInstanceCount', 0):g} x "
                      f"{'/'.join(c.get('instanceType', '?') for c in g.get('instanceConfigs', []))}"
                      for g in others)
    return wrap(f"slurm: AWS PCS cluster, Slurm {document.get('Scheduler', {}).get('Version')}, "
                f"{str(document.get('Size', '')).lower()}, accounting {'on' if accounting else 'off'}; "
                f"queues {', '.join(queues) or 'none'}; {login or 'no login group'} (no queue)")


def eks_lines(result: Plan, cost: StackCost | str) -> list[str]:
    """An EKS stack's cluster as planned: its name, Kubernetes version, endpoint and add-ons, the system
    node group, and what the control plane and system nodes cost a month; nothing on other stacks."""
    clusters = result.of_type("aws:eks/cluster:Cluster")
    if not clusters:
        return []
    cluster = clusters[0].inputs
    public = (cluster.get("vpcConfig") or {}).get("endpointPublicAccess")
    addons = sorted(str(a.inputs.get("addonName")) for a in result.of_type("aws:eks/addon:Addon"))
    system = ", ".join(f"{(g.inputs.get('scalingConfig') or {}).get('desiredSize', 0):g} x "
                       f"{'/'.join(g.inputs.get('instanceTypes') or [])}"
                       for g in result.of_type("aws:eks/nodeGroup:NodeGroup"))
    fees = [] if isinstance(cost, str) else [o for o in cost.other if o.kind == "eks"]
    monthly = f"; ${sum(o.usd_per_month('desired') for o in fees):,.0f}/month" if fees else ""
    return wrap(f"eks: EKS cluster {cluster.get('name')}, Kubernetes {cluster.get('version')}, "
                f"{'public and private' if public else 'private'} endpoint; add-ons {', '.join(addons)}; "
                f"system nodes {system or 'none'}{monthly} (control plane and system nodes)")


def node_group_lines(result: Plan, cost: StackCost | str) -> list[str]:
    """One row per node group: name, type x desired/max nodes, GPUs, zones, EFA, purchase mix
    (at desired nodes: on-demand base, on-demand above it, spot; or a Capacity Block) and $/h."""
    spec = result.spec
    priced = {g.name: g for g in cost.groups} if not isinstance(cost, str) else {}
    rows = []
    for group in spec.node_groups:
        first = group.types[0] if group.types else None
        gpus = first.gpus if first else 0
        more = f" (+{len(group.instance_types) - 1})" if len(group.instance_types) > 1 else ""
        priced_group = priced.get(group.name)
        rows.append([
            group.name, f"{group.instance_types[0]}{more} x {group.desired_nodes}/{group.max_nodes}",
            f"{gpus * group.desired_nodes}/{gpus * group.max_nodes}", zone_list(spec.azs_of(group)),
            "EFA" if group.efa_enabled else "-", purchase_mix(priced_group),
            "-" if priced_group is None else f"${priced_group.usd_per_hour('desired'):,.2f}"])
    return table(["node group", "type x desired/max", "GPUs", "zone", "EFA", "purchase", "$/h"], rows)


def zone_list(zones: Sequence[str]) -> str:
    """`us-west-2a/b/c` for zones of one region (their letters after the first), else comma-separated."""
    region = zones[0][:-1] if zones else ""
    if len(zones) > 1 and all(z[:-1] == region and len(z) == len(region) + 1 for z in zones):
        return zones[0] + "".join(f"/{z[-1]}" for z in zones[1:])
    return ",".join(zones)


def node_group_summary(result: Plan, cost: StackCost | str) -> list[dict[str, Any]]:
    """`plan --json`'s `node_groups`: what node_group_lines prints, as values."""
    spec = result.spec
    priced = {g.name: g for g in cost.groups} if not isinstance(cost, str) else {}
    out = []
    for group in spec.node_groups:
        gpus = group.types[0].gpus if group.types else 0
        priced_group = priced.get(group.name)
        split = priced_group.desired if priced_group is not None else None
        block = priced_group is not None and priced_group.capacity_block
        out.append({
            "name": group.name, "instance_types": list(group.instance_types),
            "desired_nodes": group.desired_nodes, "max_nodes": group.max_nodes,
            "gpus_per_node": gpus, "gpus_desired": gpus * group.desired_nodes,
            "gpus_max": gpus * group.max_nodes, "availability_zones": spec.azs_of(group),
            "efa": group.efa_enabled,
            "purchase": None if split is None else {
                "base": split.base, "on_demand": split.on_demand, "spot": split.spot,
                "capacity_block": block},
            "usd_per_hour": None if priced_group is None else round(priced_group.usd_per_hour("desired"), 4)})
    return out


def purchase_mix(group: Any) -> str:
    """`2 base + 1 on-demand + 5 spot` at desired nodes (a pricing.GroupCost), or `capacity block`."""
    if group is None:
        return "-"
    if group.capacity_block:
        return "capacity block"
    split = group.desired
    parts = [f"{n} {label}" for n, label in ((split.base, "base"), (split.on_demand, "on-demand"),
                                             (split.spot, "spot")) if n]
    return " + ".join(parts) or "none (0 nodes)"


def cost_lines(stack: str, cost: StackCost | str) -> list[str]:
    """The cost of a plan: monthly at desired and at max nodes, and the saving against on-demand."""
    if isinstance(cost, str):
        return wrap(f"cost: not priced ({cost})")
    saving = (f"({cost.saving_percent('desired'):.1f} % / {cost.saving_percent('max'):.1f} % below all "
              "on-demand)")
    first = (f"cost: ${cost.usd_per_month('desired'):,.0f}/month at desired nodes, "
             f"${cost.usd_per_month('max'):,.0f} at max")
    lines = [f"{first} {paint(saving, 'good')}" if len(first) + len(saving) < WIDTH
             else first, *([] if len(first) + len(saving) < WIDTH else [f"  {paint(saving, 'good')}"])]
    if cost.schedule.scheduled:
        lines.append(f"  as scheduled ({cost.schedule.hours_per_month:,.0f} h/month) "
                     f"${cost.usd_per_month('desired', scheduled=True):,.0f} at desired nodes")
    more = f"`gpucluster cost {stack}` for the breakdown"
    if cost.warnings:
        more = paint(f"{len(cost.warnings)} warning(s)", "warn") + f"; {more}"
    return [*lines, f"  {more}"]


def violation_lines(violations: list[Violation]) -> list[str]:
    """The policy verdict, then each violation: level, policy and resource, the message under it."""
    if not violations:
        return [paint("policies: no violations", "good")]
    mandatory = sum(v.mandatory for v in violations)
    verdict = f"policies: {len(violations)} violation(s), {mandatory} mandatory"
    if mandatory:
        verdict = paint(verdict + " (the policy pack stops `pulumi up`)", "bad")
    out = [verdict]
    for v in sorted(violations, key=lambda v: (not v.mandatory, v.policy, v.resource_name or "")):
        where = f"{kind(v.resource_type)} {v.resource_name}" if v.resource_type else "stack"
        head = wrap(f"{v.level:<9}  {v.policy}  {where}", indent="  ", hang="      ")  # wrapped, never cut
        head[0] = head[0].replace(v.level, paint(v.level, "bad" if v.mandatory else "warn"), 1)
        out += head
        out += wrap(v.message, indent="      ", hang="")
    return out


def tree_lines(resources: list[PlannedResource]) -> list[str]:
    """Indented tree of `kind  name` (see `kind`), children under their parent (the plan's order)."""
    children: dict[str | None, list[PlannedResource]] = {}
    urns = {r.urn for r in resources}
    for r in resources:
        children.setdefault(r.parent if r.parent in urns else None, []).append(r)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for r in children.get(parent, []):
            flags = "".join(f" [{f}]" for f, on in (("protect", r.protect),
                                                   ("retain", r.retain_on_delete)) if on)
            lines.append(f"{'  ' * depth}{kind(r.type)}  {r.name}{flags}")
            walk(r.urn, depth + 1)

    walk(None, 0)
    return lines


# ------------------------------------------------------------------------ spinner


@contextmanager
def progress(message: str, delay: float = 1.0) -> Iterator[None]:
    """A spinner with `message` on stderr while the block runs, from `delay` seconds on.

    Only on a terminal (never in JSON mode, a pipe or CI logs): AWS calls are usually quick,
    and a spinner that flashes for 100 ms is noise.
    """
    if json_mode() or not _interactive(sys.stderr):
        yield
        return
    lock = threading.Lock()
    state: dict[str, Any] = {"done": False, "status": None}

    def start() -> None:
        from rich.console import Console  # only when a spinner is really shown

        with lock:
            if not state["done"]:
                state["status"] = Console(stderr=True).status(message)
                state["status"].start()

    timer = threading.Timer(delay, start)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            state["done"] = True  # a timer firing late shows nothing
            if state["status"] is not None:
                state["status"].stop()


def _interactive(stream: IO[str]) -> bool:
    if os.environ.get("TERM") == "dumb" or os.environ.get("CI"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# ------------------------------------------------------------------------- Slurm


def slurm_job_lines(jobs: Sequence[SlurmJob]) -> list[str]:
    """`gpucluster jobs` on a Slurm stack: Slurm's own words for each job (state, reason, exit)."""
    def exit_text(j: SlurmJob) -> str:
        if j.exit_code is None:
            return "-"
        return f"{j.exit_code}" + (f" (signal {j.signal})" if j.signal else "")

    rows = [[j.job_id, j.name, j.partition or "-", j.state, str(j.nodes), j.node_list or "-", exit_text(j),
             j.reason or "-"] for j in jobs]
    return table(["job", "name", "partition", "state", "nodes", "node list", "exit", "reason"], rows)


def slurm_node_lines(views: Sequence[NodeView]) -> list[str]:
    """`gpucluster nodes` on a Slurm stack: each Slurm node's state beside its instance's."""
    rows = []
    for v in views:
        d = v.as_json()
        rows.append([d["slurm_node"] or "-", ",".join(d["partitions"]) or "-", d["slurm_state"] or "-",
                     d["instance_id"] or "-", d["instance_type"] or "-", d["private_ip"] or "-",
                     d["ec2_state"] or "-", d["reason"] or ""])
    return table(["slurm node", "partition", "slurm state", "instance", "type", "private IP", "EC2 state",
                  "reason"], rows, min_wrap=16)


def usage_lines(rows: Sequence[UsageRow], by: str) -> list[str]:
    """`spend --by user|job`: GPU-hours and their cost, largest first."""
    money = [f"{r.usd:,.2f}" if r.usd is not None else "unpriced" for r in rows]
    if by == "user":
        return table(["user", "jobs", "node-hours", "GPU-hours", "cost $"],
                     [[r.key, str(r.jobs), f"{r.node_hours:,.2f}", f"{r.gpu_hours:,.2f}", m]
                      for r, m in zip(rows, money, strict=True)])
    return table(["job", "node-hours", "GPU-hours", "cost $", "name (user, partition, state)"],
                 [[r.key, f"{r.node_hours:,.2f}", f"{r.gpu_hours:,.2f}", m, r.detail]
                  for r, m in zip(rows, money, strict=True)], min_wrap=24)


def node_hour_lines(prices: Mapping[str, Rate], indent: str = "  ") -> list[str]:
    """Each node group's one node-hour price (pricing.node_hour_price) and its basis, a wrapped line each:
    what `spend`, `spend --by`, `scale`, `start` and `resume` print under their figures."""
    return [line for name, rate in prices.items()
            for line in wrap(f"{name}: ${rate.usd_per_hour:,.4f}/node-hour, {rate.basis}", indent)]
