"""The `gpucluster` command: offline plans and the day-two operations of a stack.

It owns argument parsing and exit codes (0 fine, 1 a finding that blocks — a
mandatory policy violation —, 2 invalid input); how things print (`--json`,
colour, errors as JSON, 100 columns) is `gpucluster.cli.render`. The work
itself lives in the modules it calls; config problems print one line each,
naming the key path, never a traceback.
"""

from __future__ import annotations

import copy
import json
import sys
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from gpucluster import pricing, project
from gpucluster.cli import render
from gpucluster.cli.render import table as render_table
from gpucluster.project import StackFileError, load_stack
from gpucluster.spec import SpecError, StackSpec, stack_warnings

if TYPE_CHECKING:
    from gpucluster.ops.status import GroupStatus, ResumeCandidate
    from gpucluster.plan import Plan
    from gpucluster.sizing import Fit, MemoryEstimate, Workload

if TYPE_CHECKING:
    from gpucluster.policy.records import Violation

EXIT_OK, EXIT_BLOCKED, EXIT_INVALID = 0, 1, 2
T = TypeVar("T")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Plan, price and operate GPU clusters on AWS built with Pulumi.",
    pretty_exceptions_enable=False,
    # Plain help: typer's rich help shows every flag as `--json <bool>`; this shows `--json`.
    rich_markup_mode=None,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON object instead (errors too).")]


def _print_version(value: bool) -> None:
    """`--version`: the installed distribution's version (its metadata, not a constant in the code)."""
    if value:
        from importlib.metadata import version

        typer.echo(f"gpucluster {version('gpucluster')}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def root(
    ctx: typer.Context,
    stacks_dir: Annotated[Path | None, typer.Option(
        "--stacks-dir", metavar="DIR",
        help="Read stack files (Pulumi.<name>.yaml) from DIR instead of the stackConfigDir of the "
             "Pulumi.yaml found from the current directory upward.")] = None,
    _version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print the installed gpucluster's version and exit.")] = False,
) -> None:
    """Plan, price and operate GPU clusters on AWS built with Pulumi."""
    render.use_json("--json" in ctx.args)  # each command sets it again; this covers --stacks-dir
    if stacks_dir is not None and not stacks_dir.is_dir():
        fail_usage("--stacks-dir", f"{stacks_dir} is not a directory")
    project.use_stacks_dir(stacks_dir)


StackArg = Annotated[str, typer.Argument(
    help="Stack name (Pulumi.<name>.yaml in the project's stack directory, see --stacks-dir) "
         "or a path to a stack file.")]


def fail_invalid(stack: str, problems: list[tuple[str | None, str]]) -> NoReturn:
    """Every problem on its own line (`path: message`), or as JSON with --json; exit 2."""
    render.fail(problems, EXIT_INVALID, title=f"invalid stack config: {stack}")


def _valid(stack: str, load: Callable[[str], T]) -> T:
    """`load(stack)`, or every config problem on its own line and exit 2."""
    try:
        return load(stack)
    except SpecError as err:
        fail_invalid(stack, [(f.path, f.message) for f in err.findings])
    except StackFileError as err:
        fail_invalid(stack, [(None, str(err))])


def run_plan(stack: str) -> Plan:
    """The stack planned under the mock engine (imported here: only `plan` pays for Pulumi)."""
    from gpucluster.plan import run_plan as plan_stack

    return plan_stack(stack)


def build_plan(stack: str) -> Plan:
    return _valid(stack, run_plan)


def build_spec(stack: str) -> StackSpec:
    """The validated spec of a stack, without running the program (exit 2 when invalid)."""
    return _valid(stack, lambda name: load_stack(name)[2])


def confirm_or_exit(command: str, question: str, yes: bool, declined: str | None = None) -> None:
    """Ask before anything that costs money or stops work (unless --yes); no, or no answer
    (stdin closed), prints `declined` and exits 1 with nothing changed. With --json it cannot
    ask: without --yes that is a usage error (exit 2)."""
    if yes:
        return
    if render.json_mode():
        fail_usage(command, "--json cannot ask for confirmation: add --yes")
    try:
        agreed = typer.confirm(question, default=False)
    except typer.Abort:
        typer.echo(f"\nno answer: pass --yes to {command} without asking")
        agreed = False
    if not agreed:
        typer.echo(declined or f"{command} cancelled: nothing changed")
        raise typer.Exit(EXIT_BLOCKED)


def fail_usage(command: str, message: str) -> NoReturn:
    """One line naming what is wrong with the command's arguments (or JSON with --json), exit 2."""
    render.fail([(command, message)], EXIT_INVALID)


def check_policies(result: Plan, config_file: Path | None) -> tuple[list[Violation], list[str]]:
    """The policy pack over the plan, and its notes (exit 2 on a bad policy config file)."""
    from gpucluster.policy.offline import check_plan, policy_notes  # only `plan` needs the rules
    from gpucluster.policy.settings import PolicyConfigError

    try:
        return check_plan(result, config_file), policy_notes(result, config_file)
    except PolicyConfigError as err:
        render.fail([render.split_problem(line) for line in err.problems], EXIT_INVALID,
                    title="invalid policy config")


@app.command()
def plan(
    stack: StackArg,
    as_json: JsonOption = False,
    tree: Annotated[bool, typer.Option(
        "--tree", "-v", "--verbose", help="Also show the resource tree and the stack outputs.")] = False,
    policy_config: Annotated[Path | None, typer.Option(
        "--policy-config", help="Policy pack config JSON (Pulumi's --policy-pack-config format); "
        "default: policies/config/<stack>.json when it exists.")] = None,
) -> None:
    """Show offline what a stack would create, what it costs and which policies it breaks.

    No AWS account or Pulumi CLI needed: the real program runs under Pulumi's mock engine.
    The verdict comes first; --tree adds the resource tree and the outputs.
    """
    render.use_json(as_json)
    result = build_plan(stack)
    cost = plan_cost(result.spec)
    violations, notes = check_policies(result, policy_config)
    warnings = stack_warnings(result.spec)
    blocked = EXIT_BLOCKED if any(v.mandatory for v in violations) else EXIT_OK
    if as_json:
        document = result.as_json()
        document["warnings"] = [{"path": w.path, "message": w.message} for w in warnings]
        document["cost"] = cost.as_json() if isinstance(cost, pricing.StackCost) else {"error": cost}
        document["violations"] = [v.as_json() for v in violations]
        document["notes"] = notes
        render.emit(document)
        raise typer.Exit(blocked)
    for line in render.plan_lines(result, cost, violations, tree, notes, [str(w) for w in warnings]):
        render.echo(line)
    raise typer.Exit(blocked)


# -------------------------------------------------------------------------- cost


def plan_cost(spec: StackSpec) -> pricing.StackCost | str:
    """The stack's cost, or why it cannot be priced (the plan itself still stands)."""
    try:
        return pricing.price_stack(spec)
    except pricing.PricingError as err:
        return str(err)


def _usd(value: float) -> str:
    return f"{value:,.2f}"


def render_cost(cost: pricing.StackCost) -> list[str]:
    """The human breakdown of `gpucluster cost STACK`."""
    hours, plan = pricing.HOURS_PER_MONTH, cost.schedule
    out = [f"stack {cost.stack} ({cost.region}): cost in USD, a month is {hours} hours",
           *render.wrap(f"hours a month: {hours} 24 x 7, {plan.hours_per_month:,.2f} as scheduled "
                        f"({plan.basis})"), ""]
    for g in cost.groups:
        out += render.wrap(f"node group {g.name}: {g.note}")
        for label, rate in (("on-demand", g.on_demand), ("base", g.base), ("spot", g.spot)):
            price = f"{rate.usd_per_hour:,.5f}".rstrip("0").rstrip(".")
            out += render.wrap(f"{label} ${price}/node-hour: {rate.basis} [{rate.source}, {rate.as_of}]",
                               indent="  ")
        rows = []
        for at in pricing.AT:
            s, parts = g.split(at), g.parts(at)
            rows.append([at, str(s.nodes), str(s.base), str(s.on_demand), str(s.spot), _usd(parts["base"]),
                         _usd(parts["on_demand"]), _usd(parts["spot"]), _usd(g.usd_per_hour(at)),
                         _usd(g.usd_per_hour(at, "all_on_demand"))])
        out += render_table(["at", "nodes", "base", "on-demand", "spot", "base $/h", "on-demand $/h",
                             "spot $/h", "mix $/h", "all on-demand $/h"], rows)
        if g.capacity_block:
            length = (f"{g.block_hours} h (capacity.duration_hours)" if g.block_hours
                      else "unknown (no capacity.duration_hours): priced as a whole month")
            out += render.wrap(f"the block: {length}, paid up front whatever the schedule; "
                               f"${g.usd_per_month('desired'):,.2f} at desired nodes in a month", "  ")
        out.append("")
    if cost.other:
        out.append("other costs")
        out += render_table(["item", "desired $/month", "max $/month", "basis"],
                            [[o.name, _usd(o.desired_usd_per_month), _usd(o.max_usd_per_month), o.basis]
                             for o in cost.other])
        out.append("")
    out.append(f"total: 24 x 7 ({hours} h/month) and as scheduled ({plan.hours_per_month:,.2f} h/month)")
    out += render_table(["strategy", "desired $/h", "desired $/month", "as scheduled", "max $/h",
                         "max $/month", "as scheduled"],
                        [[pricing.STRATEGY_LABELS[s], *[_usd(v) for at in pricing.AT for v in (
                            cost.usd_per_hour(at, s), cost.usd_per_month(at, s),
                            cost.usd_per_month(at, s, scheduled=True))]]
                         for s in pricing.STRATEGIES])
    out.append("")
    saved = {at: cost.usd_per_month(at, "all_on_demand") - cost.usd_per_month(at) for at in pricing.AT}
    out += [render.paint(line, "good") for line in render.wrap(
        f"the stack's mix is {cost.saving_percent('desired'):.1f} % below the same capacity all "
        f"on-demand at desired nodes (${saved['desired']:,.0f}/month less) and "
        f"{cost.saving_percent('max'):.1f} % at max nodes (${saved['max']:,.0f}/month less)")]
    if cost.budget_usd_per_month is not None:
        share = 100 * cost.usd_per_month("max") / cost.budget_usd_per_month
        out.append(f"budget ${cost.budget_usd_per_month:,.0f}/month: the mix at max nodes is "
                   f"{share:.0f} % of it")
    out += [render.paint(f"warning: {w}", "warn") for w in cost.warnings]
    out += ["", "assumptions:", *[line for a in cost.assumptions for line in render.wrap(f"- {a}", "  ")],
            "", "sources:"]
    seen: dict[str, str] = {}
    for g in cost.groups:
        for rate in (g.on_demand, g.base, g.spot):
            seen.setdefault(rate.source, rate.as_of)
    for o in cost.other:
        seen.setdefault(o.source, o.as_of)
    out += [line for source, as_of in seen.items() for line in render.wrap(f"- {source} ({as_of})", "  ")]
    return out


def _read_cost_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
        pricing.cost_document(doc)
    except OSError as err:
        fail_usage("cost --diff", f"cannot read {path}: {err.strerror}")
    except json.JSONDecodeError as err:
        fail_usage("cost --diff", f"{path} is not JSON ({err.msg}, line {err.lineno})")
    except pricing.PricingError as err:
        fail_usage("cost --diff", f"{path}: {err}")
    return doc


@app.command()
def cost(
    stack: Annotated[str | None, typer.Argument(
        help="Stack name (Pulumi.<name>.yaml in the project's stack directory) or a path to a "
             "stack file.")] = None,
    as_json: JsonOption = False,
    diff: Annotated[tuple[Path, Path] | None, typer.Option(
        "--diff", metavar="BASE.json HEAD.json",
        help="Print the Markdown cost difference of two `cost --json` or `plan --json` files.")] = None,
    chart: Annotated[Path | None, typer.Option(
        "--chart", metavar="FILE.png", help="Also draw monthly cost by strategy and component.")] = None,
    live: Annotated[bool, typer.Option(
        "--live", help="Price spot at live prices (needs AWS credentials).")] = False,
    dataset_gib: Annotated[float, typer.Option(
        help="Assumed S3 size of a created dataset bucket without FSx, GiB.")] = 1024,
    nat_gb: Annotated[float, typer.Option(help="Assumed data through the NAT gateway, GB/month.")] = 100,
) -> None:
    """Price a stack: node groups (base, on-demand, spot), storage and network, per hour and month."""
    render.use_json(as_json)
    if diff is not None:
        if stack is not None:
            fail_usage("cost", "give a STACK or --diff BASE.json HEAD.json, not both")
        markdown = pricing.cost_diff_markdown(_read_cost_json(diff[0]), _read_cost_json(diff[1]))
        if as_json:
            render.emit({"markdown": markdown})
        else:
            typer.echo(markdown, nl=False)
        raise typer.Exit(EXIT_OK)
    if stack is None:
        fail_usage("cost", "give a STACK (or --diff BASE.json HEAD.json)")
    if dataset_gib < 0 or nat_gb < 0:
        fail_usage("cost", "--dataset-gib and --nat-gb must be >= 0")
    spec = build_spec(stack)
    spot_rates = _live_spot_rates(spec) if live else None
    try:
        result = pricing.price_stack(spec, pricing.Assumptions(dataset_gib, nat_gb), spot_rates)
    except pricing.PricingError as err:
        fail_usage("cost", f"cannot price stack {spec.stack}: {err}")
    if chart is not None:
        from gpucluster.chart import ChartUnavailable, draw_chart

        try:
            draw_chart(result, chart)
        except ChartUnavailable as err:
            fail_usage("cost", str(err))
    if as_json:
        render.emit(result.as_json())
    else:
        for line in render_cost(result):
            render.echo(line)
        if chart is not None:
            render.say(f"chart: {chart}")


def _live_spot_rates(spec: StackSpec) -> dict[str, pricing.Rate]:
    """Live spot prices; on failure the catalog's typical discount, said on stderr."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucluster.ops.doctor import fetch_spot_prices

    try:
        with render.progress(f"reading spot prices in {spec.region}"):
            return fetch_spot_prices(spec)
    except (BotoCoreError, ClientError) as err:
        render.say(f"cost --live: no live spot prices ({err}); using the catalog's typical discount",
                   err=True)
        return {}


# --------------------------------------------------------------------- recommend


@app.command()
def recommend(
    model: Annotated[str | None, typer.Option(
        help="A known model: llama-3.2-1b/3b, llama-3.1-8b/70b/405b, mistral-7b, mixtral-8x7b/8x22b, "
             "qwen2.5-7b/72b.")] = None,
    params: Annotated[str | None, typer.Option(
        help="Model size in parameters (7, 70b, 1.5t): a known model of that size, or with --layers "
             "and --hidden any model.")] = None,
    mode: Annotated[str | None, typer.Option(help="train, finetune (full) or inference.")] = None,
    precision: Annotated[str, typer.Option(
        help="bf16, fp16, fp32; inference also fp8, int8, int4.")] = "bf16",
    seq_len: Annotated[int | None, typer.Option(help="Sequence length (default 4096).")] = None,
    batch: Annotated[int | None, typer.Option(help="Training: micro-batch per GPU (default 1).")] = None,
    concurrency: Annotated[int | None, typer.Option(
        help="Inference: sequences served at once, each with its KV cache (default 8).")] = None,
    tokens: Annotated[str | None, typer.Option(
        help="Tokens to train on (or to generate, for inference), e.g. 2t or 500b: rank by the job's "
             "cost and show its hours.")] = None,
    mfu: Annotated[float, typer.Option(
        help="Model FLOPs utilisation: the share of the GPUs' dense peak the job achieves.")] = 0.4,
    max_nodes: Annotated[int | None, typer.Option(
        help="Most nodes to use (default 64 for training, 1 for inference).")] = None,
    layers: Annotated[int | None, typer.Option(help="Model layers (another model, with --params).")] = None,
    hidden: Annotated[int | None, typer.Option(help="Model hidden size.")] = None,
    heads: Annotated[int | None, typer.Option(help="Attention heads (default hidden / 128).")] = None,
    kv_heads: Annotated[int | None, typer.Option(help="KV heads for GQA (default: heads).")] = None,
    vocab: Annotated[int | None, typer.Option(help="Vocabulary size (default 128256).")] = None,
    region: Annotated[str, typer.Option(
        help="Region: only types offered there, at its prices.")] = "us-east-1",
    zone: Annotated[str | None, typer.Option(help="Only types offered in this availability zone.")] = None,
    top: Annotated[int, typer.Option(help="How many fits to list.")] = 10,
    as_json: JsonOption = False,
) -> None:
    """Size a workload: the offered instance types and node counts that hold it, cheapest job first."""
    from gpucluster import sizing

    render.use_json(as_json)
    if model is None and params is None:
        fail_usage("recommend", "--model or --params is required (e.g. --model llama-3.1-8b or --params 70b)")
    if mode is None:
        fail_usage("recommend", "--mode is required (train, finetune or inference)")
    if top < 1:
        fail_usage("recommend", f"--top: must be >= 1, got {top}")
    try:
        workload = sizing.make_workload(params, mode, precision, seq_len, batch, max_nodes, layers, hidden,
                                        heads, kv_heads, model=model, concurrency=concurrency, vocab=vocab,
                                        tokens=tokens, mfu=mfu)
        fits = sizing.recommend(workload, region, zone)
    except sizing.SizingError as err:
        fail_usage("recommend", str(err))
    except pricing.PricingError as err:
        fail_usage("recommend", f"--region: {err}")
    memory = sizing.estimate_memory(workload)
    snippet = sizing.node_group_snippet(fits[0], workload, region, zone) if fits else None
    if as_json:
        m = workload.model
        render.emit({
            "workload": {"model": m.name, "params": m.params, "active_params": m.active_params,
                         "mode": workload.mode, "precision": workload.precision,
                         "seq_len": workload.seq_len, "batch": workload.batch,
                         "concurrency": workload.concurrency, "max_nodes": workload.max_nodes,
                         "tokens": workload.tokens, "mfu": workload.mfu, "flops": workload.flops,
                         "region": region, "zone": zone,
                         "shape": {k: v for k, v in vars(m).items() if k != "given_params"}},
            "memory_gib": {k: round(v / sizing.GIB, 3) for k, v in vars(memory).items()},
            "fits": [{**vars(f), "usd_per_effective_tflop_hour": f.usd_per_effective_tflop_hour}
                     for f in fits[:top]],
            "snippet": snippet})
    else:
        for line in render_recommendation(workload, memory, fits[:top], snippet, region, zone):
            typer.echo(line)
    if not fits:
        raise typer.Exit(EXIT_BLOCKED)


def _billions(value: float) -> str:
    return f"{value / 1e9:,.2f}B"


def render_recommendation(workload: Workload, memory: MemoryEstimate, fits: list[Fit],
                          snippet: str | None, region: str = "us-east-1",
                          zone: str | None = None) -> list[str]:
    """The human output of `gpucluster recommend`."""
    from gpucluster.sizing import CUDA_CONTEXT_GIB, FRAGMENTATION, GIB

    w, m = workload, workload.model
    per = (f"micro-batch {w.batch}" if w.training else f"{w.concurrency} concurrent sequences")
    active = f" ({_billions(m.active_params)} active per token)" if m.active_params != m.params else ""
    out = [f"{m.name} {w.mode}, {w.precision}, sequence {w.seq_len}, {per}, at most {w.max_nodes} node(s); "
           f"{_billions(m.params)} parameters{active}",
           f"shape: {m.layers} layers, hidden {m.hidden}, {m.heads} heads, {m.kv_heads} KV heads, vocabulary "
           f"{m.vocab} ({m.source})"]
    parts = [(label, getattr(memory, key) / GIB) for key, label in (
        ("weights", "weights"), ("gradients", "gradients"), ("optimizer", "optimizer states"),
        ("buffers", "ZeRO-3 buffers"), ("overhead", "runtime overhead"), ("kv_cache", "KV cache"))
        if getattr(memory, key)]
    out.append("memory: " + " + ".join(f"{label} {gib:,.1f}" for label, gib in parts)
               + f" = {memory.sharded / GIB:,.1f} GiB spread over all GPUs"
               + (" (ZeRO-3 / FSDP, as DeepSpeed's estimator counts)" if w.training
                  else " (tensor parallel)"))
    if w.training:
        out.append(f"  + per GPU: largest module {memory.largest_module / GIB:,.2f} GiB + activations "
                   f"{memory.activations / GIB:,.2f} GiB (full checkpointing) + logits "
                   f"{memory.logits / GIB:,.2f} GiB")
    out.append(f"  usable per GPU: its memory less {CUDA_CONTEXT_GIB:g} GiB CUDA context, less "
               f"{FRAGMENTATION * 100:g} % fragmentation; more than one node needs EFA on several "
               "network cards")
    where = f"zone {zone}" if zone else region
    if w.flops is not None:
        out.append(f"job: {w.tokens:,.0f} tokens x {6 if w.training else 2} x {_billions(m.active_params)} "
                   f"parameters = {w.flops:,.3g} FLOPs at {w.mfu * 100:g} % of the GPUs' dense peak (MFU)")
    if not fits:
        out.append(f"nothing offered in {where} fits: raise --max-nodes, or lower --precision, --seq-len, "
                   "--batch or --concurrency, or try another --region")
        return render.wrap_lines(out)
    out = render.wrap_lines(out)
    out += ["", f"types offered in {where}, ranked by "
            + ("the job's cost:" if w.flops is not None else "price per effective TFLOP-hour:")]
    headers = ["#", "instance type", "nodes", "GPUs", "need GiB/GPU", "usable", "$/h", "price", "spot $/h",
               "EFA", "eff. TFLOPS"]
    headers += ["hours", "job $"] if w.flops is not None else ["$/eff. TFLOP-h"]
    rows = []
    for i, f in enumerate(fits, 1):
        row = [str(i), f.instance_type, str(f.nodes), f"{f.gpus} x {f.gpu_model}",
               f"{f.need_gib_per_gpu:.1f}", f"{f.usable_gib_per_gpu:.1f}", _usd(f.usd_per_hour),
               f.price_basis, "-" if f.spot_usd_per_hour is None else _usd(f.spot_usd_per_hour),
               "yes" if f.efa else "no", f"{f.effective_tflops:,.0f}"]
        if f.hours is not None and f.job_usd is not None:
            row += [f"{f.hours:,.1f}", _usd(f.job_usd)]
        else:
            row += [f"{f.usd_per_effective_tflop_hour:.5f}"]
        rows.append(row)
    out += render_table(headers, rows)
    out += ["", "node group for the best fit (paste under `config:` in stacks/Pulumi.<env>.yaml):", ""]
    out += render.yaml_lines(snippet or "")
    return out


# ------------------------------------------------------------------------ doctor


def _read_outputs(path: Path) -> set[str]:
    """The Auto Scaling groups a deployed stack owns, from `pulumi stack output --json` (exit 2 if bad)."""
    from gpucluster.ops.doctor import own_group_names

    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object of stack outputs")
        return own_group_names(doc)
    except OSError as err:
        fail_usage("doctor --outputs", f"cannot read {path}: {err.strerror}")
    except json.JSONDecodeError as err:
        fail_usage("doctor --outputs", f"{path} is not JSON ({err.msg}, line {err.lineno})")
    except ValueError as err:
        fail_usage("doctor --outputs", f"{path}: {err}")


@app.command()
def doctor(
    stack: StackArg,
    outputs: Annotated[Path | None, typer.Option(
        "--outputs", metavar="FILE.json",
        help="The stack's outputs (`pulumi stack output --json`; `{}` before its first deploy): "
             "which Auto Scaling groups are its own. Without it, groups are told apart by their "
             "node-group tag.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Check a stack against the AWS account (read-only): offerings, EFA, reservations, quotas, the
    identity and the budget's cost-allocation tag. Exit 1 on a blocker: run it before `pulumi up`."""
    from gpucluster.ops.doctor import DoctorError, has_blocker, run_checks

    render.use_json(as_json)
    spec = build_spec(stack)
    own = _read_outputs(outputs) if outputs is not None else None
    try:
        with render.progress(f"checking {spec.stack} against the AWS account ({spec.region})"):
            findings = run_checks(spec, own_groups=own)
    except DoctorError as err:
        fail_usage("doctor", str(err))
    counts = Counter(f.level for f in findings)
    code = EXIT_BLOCKED if has_blocker(findings) else EXIT_OK
    if as_json:
        render.emit({"stack": spec.stack, "region": spec.region, "identity": spec.identity,
                     "findings": [asdict(f) for f in findings],
                     "counts": {level: counts[level] for level in ("ok", "warning", "blocker")},
                     "blocked": code == EXIT_BLOCKED})
        raise typer.Exit(code)
    for line in render.wrap(f"stack {spec.stack} ({spec.region}), gpucluster:stack={spec.identity}: "
                            "pre-flight checks against the AWS account"):
        render.echo(line)
    styles = {"blocker": "bad", "warning": "warn"}
    for line in render_table(["level", "check", "subject", "finding"],
                             [[f.level, f.check, f.subject, f.message] for f in findings]):
        level = line[2:].split(" ", 1)[0]  # a row's first line starts with its level
        render.echo(line.replace(level, render.paint(level, styles[level]), 1) if level in styles else line)
    summary = f"{counts['ok']} ok, {counts['warning']} warning(s), {counts['blocker']} blocker(s)"
    render.echo(render.paint(summary, "bad" if code == EXIT_BLOCKED else "good"))
    raise typer.Exit(code)


# -------------------------------------------------------------- resume / status


def _autoscaling(spec: StackSpec) -> Any:
    """An Auto Scaling client in the stack's region (honours AWS_ENDPOINT_URL)."""
    import boto3

    return boto3.client("autoscaling", region_name=spec.region)


def _cost_explorer(spec: StackSpec) -> Any:
    """A Cost Explorer client (its one endpoint serves every region; honours AWS_ENDPOINT_URL)."""
    import boto3

    return boto3.client("ce", region_name=spec.region)


def cost_tag_line(spec: StackSpec) -> str | None:
    """One line when the budget's cost-allocation tag is not active (the budget then sees $0)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gpucluster.ops.doctor import ACTIVATE_TAG, cost_tag_status
    from gpucluster.spec import STACK_TAG

    try:
        state = cost_tag_status(_cost_explorer(spec), [STACK_TAG])[STACK_TAG]
    except (BotoCoreError, ClientError) as err:
        return f"cost tag {STACK_TAG}: could not check whether it is active ({err})"
    if state == "Active":
        return None
    what = "inactive" if state else "not active (AWS does not list it yet)"
    effect = (f"the budget (${spec.budget.monthly_limit_usd:,.0f}/month) sees $0 of this stack's spend and "
              "its scale-to-zero never fires" if spec.budget else "costs by this tag read $0")
    activate = ACTIVATE_TAG.format(key=STACK_TAG)
    return f"warning: cost-allocation tag {STACK_TAG} is {what}: {effect}; {activate}"


def _aws_call(command: str, call: Callable[[], T], doing: str | None = "asking AWS") -> T:
    """Run an AWS call (a spinner saying `doing` after a second; None: no spinner, the caller
    shows progress); no credentials or an AWS error: one line (JSON with --json), exit 2."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        with render.progress(doing) if doing else nullcontext():
            return call()
    except (BotoCoreError, ClientError) as err:
        fail_usage(command, f"AWS said: {err}")


def render_status(rows: list[GroupStatus]) -> list[str]:
    return render_table(
        ["group", "min", "desired", "max", "in service", "stopped by", "previous desired"],
        [[r.name, str(r.min_size), str(r.desired_capacity), str(r.max_size), str(r.in_service),
          r.stopped_by or "-", "-" if r.previous_desired is None else str(r.previous_desired)]
         for r in rows])


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def render_health(rows: list[GroupStatus]) -> list[str]:
    """Per group: healthy of in service, GPU utilisation of the last 15 minutes, last replacement."""
    def replaced(r: GroupStatus) -> str:
        last = r.last_replacement
        return "-" if last is None else f"{last.time} {last.instance_id or '?'}: {last.reason}"

    return render_table(
        ["group", "healthy/in service", "gpu avg 15m", "gpu max 15m", "last health replacement"],
        [[r.name, f"{r.healthy}/{r.in_service}", _percent(r.gpu_utilization_avg),
          _percent(r.gpu_utilization_max), replaced(r)] for r in rows])


def status_json(spec: StackSpec, rows: list[GroupStatus], url: str) -> dict[str, Any]:
    """`status --json`: the same facts as the tables, one object per group."""
    return {"stack": spec.stack, "identity": spec.identity, "region": spec.region, "dashboard_url": url,
            "groups": [asdict(r) for r in rows]}


@app.command()
def status(stack: StackArg, as_json: JsonOption = False) -> None:
    """List the stack's node groups: capacity, who stopped them, GPU health and use, and the dashboard."""
    import boto3

    from gpucluster.names import dashboard_name, dashboard_url
    from gpucluster.noderole import gpu_metric_namespace
    from gpucluster.ops.status import stack_status  # boto3: only the AWS commands pay for it

    render.use_json(as_json)
    spec = build_spec(stack)
    url = dashboard_url(spec.region, dashboard_name(spec.cluster.name, spec.region))
    rows = _aws_call("status", lambda: stack_status(
        spec.identity, autoscaling_client=_autoscaling(spec),
        cloudwatch_client=boto3.client("cloudwatch", region_name=spec.region), health=True,
        metric_namespace=gpu_metric_namespace(spec.cluster.name)),
        f"reading {spec.stack}'s Auto Scaling groups and GPU metrics in {spec.region}")
    with render.progress("checking the budget's cost-allocation tag"):
        warning = cost_tag_line(spec)
    if as_json:
        document = status_json(spec, rows, url)
        document["cost_tag_warning"] = warning
        render.emit(document)
        raise typer.Exit(EXIT_OK)
    if not rows:
        out = render.wrap(f"stack {spec.stack} ({spec.region}): no Auto Scaling groups tagged "
                          f"gpucluster:stack={spec.identity} (not deployed, another account or region, "
                          "or deployed from another Pulumi organization or project)")
    else:
        out = [*render.wrap(f"stack {spec.stack} ({spec.region}), gpucluster:stack={spec.identity}:"),
               *render_status(rows), "", "GPU health and use:", *render_health(rows), "",
               f"dashboard: {url}"]  # a URL stays whole, however long
    if warning:
        out += [render.paint(line, "warn") for line in render.wrap(warning)]
    for line in out:
        render.echo(line)


def _resume_price(spec: StackSpec, candidate: ResumeCandidate) -> tuple[str, float | None]:
    return node_group_rate(spec, candidate.node_group)


def node_group_rate(spec: StackSpec, node_group: str | None) -> tuple[str, float | None]:
    """(instance type, on-demand USD per node-hour) of a node group, by name.

    The node group's first instance type, as `gpucluster cost` prices it; None when
    the group carries no node-group tag, the stack file no longer has that node
    group, or the region has no price.
    """
    group = next((g for g in spec.node_groups if g.name == node_group), None)
    if group is None or not group.types:
        return "?", None
    first = group.types[0]
    try:
        return first.name, pricing.on_demand_rate(first, spec.region).usd_per_hour
    except pricing.PricingError:
        return first.name, None


def _resume_json(spec: StackSpec, candidate: ResumeCandidate) -> dict[str, Any]:
    """One group in `resume --json`: what resume would do to it, and its cost per hour if it does."""
    d = candidate.decision
    instance_type, rate = _resume_price(spec, candidate)
    return {"group": d.group, "node_group": candidate.node_group, "action": d.action,
            "stopped_by": d.stopped_by, "reason": d.reason or None, "nodes_now": candidate.desired_now,
            "nodes_after": d.desired_capacity, "min_after": d.min_size, "instance_type": instance_type,
            "on_demand_usd_per_hour": None if rate is None or d.action != "resume"
            else round(rate * candidate.added_nodes, 4)}


def render_resume_plan(spec: StackSpec, todo: list[ResumeCandidate], action: str = "resume") -> list[str]:
    """What `resume` will restart, what it costs per hour, and the warning for budget stops."""
    rows, total, unpriced = [], 0.0, []
    for c in todo:
        d = c.decision
        instance_type, rate = _resume_price(spec, c)
        cost = None if rate is None else rate * c.added_nodes
        if cost is None:
            unpriced.append(c.group)
        else:
            total += cost
        rows.append([c.group, c.node_group or "?", d.stopped_by or "-", str(c.desired_now),
                     str(d.desired_capacity), str(d.min_size), instance_type,
                     "?" if cost is None else _usd(cost)])
    added = sum(c.added_nodes for c in todo)
    out = [f"stack {spec.stack} ({spec.region}): {action} restarts {len(todo)} group(s), "
           f"{added} node(s):"]
    out += render_table(["group", "node group", "stopped by", "nodes now", "nodes after", "min after",
                         "instance type", "on-demand $/h"], rows)
    bound = "at least " if unpriced else ""
    out.append(f"cost: {bound}${_usd(total)}/hour (${_usd(total * 24)}/day) at on-demand rates of "
               f"the first instance type; spot nodes cost less")
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


def explain_nothing_to_resume(stack: str, spec: StackSpec, candidates: list[ResumeCandidate],
                              only: list[str]) -> list[str]:
    """Why `resume` has nothing to do, per group, and what to do instead."""
    from gpucluster.lambdas.tags import PREVIOUS_DESIRED_TAG, STOPPED_BY_TAG

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


@app.command()
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
    from gpucluster.lambdas.nodegroups import STOP_REASONS
    from gpucluster.ops.status import plan_resume, resume_stack, stack_status

    render.use_json(as_json)
    if as_json and not (yes or dry_run):
        fail_usage("resume", "--json cannot ask for confirmation: add --yes to resume, or --dry-run")
    spec = build_spec(stack)
    unknown = sorted(set(only or []) - set(STOP_REASONS))
    if unknown:
        fail_usage("resume", f"--only: unknown reason {', '.join(unknown)} "
                             f"(one of {', '.join(STOP_REASONS)})")
    client = _autoscaling(spec)
    candidates = _aws_call("resume", lambda: plan_resume(spec.identity, autoscaling_client=client,
                                                         only_stopped_by=only or None),
                           f"reading {spec.stack}'s Auto Scaling groups in {spec.region}")
    todo = [c for c in candidates if c.decision.action == "resume"]
    if as_json:
        document = {"stack": spec.stack, "region": spec.region, "identity": spec.identity, "dry_run": dry_run,
                    "groups": [_resume_json(spec, c) for c in candidates], "resumed": [], "status": []}
        if todo and not dry_run:
            shown = {c.group: c.decision.stopped_by for c in todo}
            document["resumed"] = [asdict(r) for r in _aws_call("resume", lambda: resume_stack(
                spec.identity, autoscaling_client=client, only_stopped_by=only or None, shown=shown))]
            document["status"] = [asdict(r) for r in _aws_call(
                "resume", lambda: stack_status(spec.identity, autoscaling_client=client))]
        render.emit(document)
        raise typer.Exit(EXIT_OK)
    if not todo:
        for line in explain_nothing_to_resume(stack, spec, candidates, only or []):
            render.say(line)
        raise typer.Exit(EXIT_OK)
    for line in render_resume_plan(spec, todo):
        render.say(line)
    if dry_run:
        render.say("dry run: nothing changed")
        raise typer.Exit(EXIT_OK)
    confirm_or_exit("resume", f"Restart {len(todo)} group(s)?", yes)
    shown = {c.group: c.decision.stopped_by for c in todo}
    results = _aws_call("resume", lambda: resume_stack(
        spec.identity, autoscaling_client=client, only_stopped_by=only or None, shown=shown),
        f"restarting {len(todo)} group(s)")
    before = {c.group: c.desired_now for c in todo}
    for r in results:
        if r.action == "resumed":
            render.say(f"resumed {r.group} (stopped by {r.stopped_by}): {before.get(r.group, 0)} -> "
                       f"{r.desired_capacity} node(s), min {r.min_size}")
        else:
            render.say(f"not resumed {r.group}: {r.reason}")
    rows = _aws_call("resume", lambda: stack_status(spec.identity, autoscaling_client=client))
    for line in render_status(rows):
        render.say(line)


# -------------------------------------------------------------------------- init


@app.command()
def init(
    directory: Annotated[Path, typer.Argument(
        help="Where to create the project: a new or empty directory.")] = Path("."),
    as_json: JsonOption = False,
) -> None:
    """Create a Pulumi project that uses gpucluster: Pulumi.yaml, __main__.py, a dev stack, policies."""
    from gpucluster.scaffold import ScaffoldError, create_project

    render.use_json(as_json)
    try:
        written = create_project(directory)
    except ScaffoldError as err:
        fail_usage("init", str(err))
    here = directory.resolve() == Path.cwd().resolve()
    next_step = f"{'' if here else f'cd {directory} && '}gpucluster plan dev"
    if as_json:
        render.emit({"directory": str(directory), "created": [str(p.relative_to(directory)) for p in written],
                     "next": next_step})
        raise typer.Exit(EXIT_OK)
    typer.echo(f"created a gpucluster project in {directory}:")
    for path in written:
        typer.echo(f"  {path.relative_to(directory)}")
    typer.echo("")
    typer.echo(f"next: {next_step}   (README.md has the steps to deploy)")


# The other commands register themselves on `app` when imported (they import from this module).
from gpucluster.cli import capacity as _capacity  # noqa: E402,F401  capacity search, buy
from gpucluster.cli import jobs as _jobs  # noqa: E402,F401  nodes, run, hostfile, scale, stop, start, jobs...
from gpucluster.cli import spend as _spend  # noqa: E402,F401  spend


def invoked(args: list[str]) -> str | None:
    """The command `args` name (`plan` in `--stacks-dir d plan prod`); None for none or an option."""
    words = iter(args)
    for word in words:
        if word == "--stacks-dir":
            next(words, None)
        elif not word.startswith("--stacks-dir="):
            return None if word.startswith("-") else word
    return None


def app_for(args: list[str]) -> typer.Typer:
    """`app` with only the command `args` invoke, or the whole app (no command, `--help`, a typo).

    typer builds every registered command from its signature on each run (20 ms for the twenty
    commands here): one command's run builds that one. Same options, callback and messages.
    """
    name = invoked(args)
    found = [c for c in app.registered_commands
             if (c.name or typer.main.get_command_name(c.callback.__name__)) == name]  # type: ignore[union-attr]
    groups = [g for g in app.registered_groups if g.name == name]
    if name is None or not (found or groups):
        return app
    only = copy.copy(app)  # shallow: the settings and the root callback are the app's own
    only.registered_commands, only.registered_groups = found, groups
    return only


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point; with --json, a usage error (a bad option) is JSON too."""
    args = sys.argv[1:] if argv is None else argv
    run = app_for(args)
    if "--json" not in args:
        sys.exit(run(args))
    try:
        code = run(args, standalone_mode=False)
    except typer.TyperException as err:  # usage errors: unknown option, missing argument, bad value
        render.use_json(True)
        message = err.format_message() if hasattr(err, "format_message") else str(err)
        try:
            render.fail([(None, message)], getattr(err, "exit_code", EXIT_INVALID))
        except typer.Exit as exit_:
            code = exit_.exit_code
    except typer.Abort:
        code = EXIT_BLOCKED
    sys.exit(code or 0)


if __name__ == "__main__":
    main()
