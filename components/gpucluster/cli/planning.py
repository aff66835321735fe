"""Offline commands: `plan`, `cost`, `recommend` and `init` (no AWS account, no Pulumi CLI).

It owns their options, their human output and `--json` documents; the work is in
`gpucluster.plan`, `gpucluster.pricing`, `gpucluster.sizing`, `gpucluster.policy` and
`gpucluster.scaffold`. It must never import another command module or touch AWS except
`cost --live`'s read of spot prices (through `gpucluster.ops.doctor`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpucluster import catalog, costdiff, ledger, pricing
from gpucluster.cli import render
from gpucluster.cli.common import (
    EXIT_BLOCKED,
    EXIT_INVALID,
    EXIT_OK,
    JsonOption,
    StackArg,
    build_plan,
    build_spec,
    fail_usage,
    usd,
)
from gpucluster.spec import Finding, StackSpec, baked_image, stack_warnings

if TYPE_CHECKING:
    from gpucluster.plan import Plan
    from gpucluster.policy.records import Violation
    from gpucluster.sizing import Fit, MemoryEstimate, Workload


def check_policies(result: Plan, config_file: Path | None) -> tuple[list[Violation], list[str]]:
    """The policy pack over the plan, and its notes (exit 2 on a bad policy config file)."""
    from gpucluster.policy.offline import check_plan, policy_notes  # only `plan` needs the rules
    from gpucluster.policy.settings import PolicyConfigError

    try:
        return check_plan(result, config_file), policy_notes(result, config_file)
    except PolicyConfigError as err:
        render.fail([render.split_problem(line) for line in err.problems], EXIT_INVALID,
                    title="invalid policy config")


def plan(
    stack: StackArg,
    as_json: JsonOption = False,
    tree: Annotated[bool, typer.Option(
        "--tree", "-v", "--verbose", help="Also show the resource tree and the stack outputs.")] = False,
    policy_config: Annotated[Path | None, typer.Option(
        "--policy-config", help="Policy pack config JSON (Pulumi's --policy-pack-config format); "
        "default: policies/config/<stack>.json, else <environment>.json, when it exists.")] = None,
) -> None:
    """Show offline what a stack would create, what it costs and which policies it breaks.

    No AWS account or Pulumi CLI needed: the real program runs under Pulumi's mock engine.
    The verdict comes first; --tree adds the resource tree and the outputs.
    """
    render.use_json(as_json)
    result = build_plan(stack)
    cost = plan_cost(result.spec)
    violations, notes = check_policies(result, policy_config)
    warnings = [*stack_warnings(result.spec), *cost_warnings(cost)]
    blocked = EXIT_BLOCKED if any(v.mandatory for v in violations) else EXIT_OK
    facts = ledger.unverified_facts(result.spec)
    fetch = guard_fetch_line(result.spec)
    if as_json:
        document = result.as_json()
        if fetch is not None:
            document["guard_price_fetch"] = fetch
        document["warnings"] = [{"path": w.path, "message": w.message} for w in warnings]
        document["cost"] = cost.as_json() if isinstance(cost, pricing.StackCost) else {"error": cost}
        document["violations"] = [v.as_json() for v in violations]
        document["notes"] = notes
        document["node_groups"] = render.node_group_summary(result, cost)
        document["unverified_facts"] = [f.as_json() for f in facts]
        render.emit(document)
        raise typer.Exit(blocked)
    for line in render.plan_lines(result, cost, violations, tree, notes, [str(w) for w in warnings]):
        render.echo(line)
    for line in image_lines(result.spec):
        render.echo(line)
    for line in render.wrap(fetch) if fetch is not None else []:
        render.echo(line)
    for line in render.wrap(ledger.plan_line(facts)) if facts else []:  # none when the stack relies on none
        render.echo(line)
    raise typer.Exit(blocked)


def guard_fetch_line(spec: StackSpec) -> str | None:
    """One line when the stack's spend guard has no rendered price for a type its groups launch: it then
    asks the AWS Price List at run time (gpucluster.fleet.pricelist); None when it would not."""
    if spec.budget is None or spec.budget.action_threshold_percent is None:
        return None
    table = pricing.guard_prices(spec)
    types = sorted({t for g in spec.node_groups for t in g.instance_types
                    if t not in table["on_demand"] and t not in table["capacity_block"]})
    if not types:
        return None
    return (f"spend guard: no price rendered for {', '.join(types)} in {spec.region}: it asks the AWS Price "
            f"List at run time (pricing:GetProducts, cached in the guard-state table); "
            f"{catalog.fetch_hint(spec.region)} to render them")


def image_lines(spec: StackSpec) -> list[str]:
    """Which image each group launches from and what it carries (stacks that bake only)."""
    baked = {g.name: baked_image(spec.images, g) for g in spec.node_groups}
    if not any(baked.values()):
        return []
    out = ["images (EC2 Image Builder):"]
    for name, image in baked.items():
        if image is None:
            text = "not baked: installs at boot"
        elif image.ami_id is None:
            text = (f"baked, no image pinned yet: installs at boot until images.groups.{name}.ami_id is "
                    f"set (gpucluster image build {spec.stack})")
        else:
            carries = ", ".join(f"{k} {v}" for k, v in (("driver", image.driver), ("CUDA", image.cuda)) if v)
            text = (f"launches from {image.ami_id}" + (f" ({carries})" if carries else "")
                    + ", installs nothing")
        out += render.wrap(f"{name}: {text}", indent="  ")
    return out


# -------------------------------------------------------------------------- cost


def cost_warnings(cost: pricing.StackCost | str) -> list[Finding]:
    """The plan warnings the stack's cost gives (with the spec's: shown with the verdict, in --json)."""
    hour = cost.budget_below_an_hour() if isinstance(cost, pricing.StackCost) else None
    return [Finding("budget.monthly_limit_usd", hour, "warning")] if hour else []


def plan_cost(spec: StackSpec) -> pricing.StackCost | str:
    """The stack's cost, or why it cannot be priced (the plan itself still stands)."""
    try:
        return pricing.price_stack(spec)
    except pricing.PricingError as err:
        return str(err)


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
        node = pricing.node_hour_price(g)
        price = f"{node.usd_per_hour:,.5f}".rstrip("0").rstrip(".")
        out += render.wrap(f"mix ${price}/node-hour: {node.basis}", indent="  ")
        rows = []
        for at in pricing.AT:
            s, parts = g.split(at), g.parts(at)
            rows.append([at, str(s.nodes), str(s.base), str(s.on_demand), str(s.spot), usd(parts["base"]),
                         usd(parts["on_demand"]), usd(parts["spot"]), usd(g.usd_per_hour(at)),
                         usd(g.usd_per_hour(at, "all_on_demand"))])
        out += render.table(["at", "nodes", "base", "on-demand", "spot", "base $/h", "on-demand $/h",
                             "spot $/h", "mix $/h", "all on-demand $/h"], rows)
        if g.capacity_block:
            length = (f"{g.block_hours} h (capacity.duration_hours)" if g.block_hours
                      else "unknown (no capacity.duration_hours): priced as a whole month")
            out += render.wrap(f"the block: {length}, paid up front whatever the schedule; "
                               f"${g.usd_per_month('desired'):,.2f} at desired nodes in a month", "  ")
        out.append("")
    if cost.other:
        out.append("other costs")
        out += render.table(["item", "desired $/month", "max $/month", "basis"],
                            [[o.name, usd(o.desired_usd_per_month), usd(o.max_usd_per_month), o.basis]
                             for o in cost.other])
        out.append("")
    out.append(f"total: 24 x 7 ({hours} h/month) and as scheduled ({plan.hours_per_month:,.2f} h/month)")
    out += render.table(["strategy", "desired $/h", "desired $/month", "as scheduled", "max $/h",
                         "max $/month", "as scheduled"],
                        [[pricing.STRATEGY_LABELS[s], *[usd(v) for at in pricing.AT for v in (
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


def cost_json(cost: pricing.StackCost) -> dict[str, Any]:
    """`cost --json`: the cost model's document, each node group with its one node-hour price and its
    basis added (pricing.node_hour_price: what spend, scale, start and resume show for the group)."""
    doc = cost.as_json()
    for group, priced in zip(doc["node_groups"], cost.groups, strict=True):
        node = pricing.node_hour_price(priced)
        group["usd_per_node_hour"], group["price_basis"] = round(node.usd_per_hour, 4), node.basis
    return doc


def read_cost_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
        costdiff.cost_document(doc)
    except OSError as err:
        fail_usage("cost --diff", f"cannot read {path}: {err.strerror}")
    except json.JSONDecodeError as err:
        fail_usage("cost --diff", f"{path} is not JSON ({err.msg}, line {err.lineno})")
    except pricing.PricingError as err:
        fail_usage("cost --diff", f"{path}: {err}")
    return doc


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
        markdown = costdiff.cost_diff_markdown(read_cost_json(diff[0]), read_cost_json(diff[1]))
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
    spot_rates = live_spot_rates(spec) if live else None
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
        render.emit(cost_json(result))
    else:
        for line in render_cost(result):
            render.echo(line)
        if chart is not None:
            render.say(f"chart: {chart}")


def live_spot_rates(spec: StackSpec) -> dict[str, pricing.Rate]:
    """Live spot prices; on failure the catalog's typical discount, said on stderr."""
    from gpucluster.ops.awserrors import AWS_ERRORS, describe, guard_default_session
    from gpucluster.ops.doctor import fetch_spot_prices

    guard_default_session()
    try:
        with render.progress(f"reading spot prices in {spec.region}"):
            return fetch_spot_prices(spec)
    except AWS_ERRORS as err:
        render.say(f"cost --live: no live spot prices ({describe(err)}); using the catalog's typical "
                   "discount", err=True)
        return {}


# --------------------------------------------------------------------- recommend


def recommend(
    model: Annotated[str | None, typer.Option(
        help="A known model: llama-3.2-1b/3b, llama-3.1-8b/70b/405b, mistral-7b, mixtral-8x7b/8x22b, "
             "qwen2.5-7b/72b.")] = None,
    params: Annotated[str | None, typer.Option(
        help="Model size in parameters (7, 70b, 1.5t): a known model of that size, or with --layers "
             "and --hidden any model.")] = None,
    mode: Annotated[str | None, typer.Option(
        help="train, finetune (full), lora, qlora (4-bit base) or inference.")] = None,
    precision: Annotated[str, typer.Option(
        help="bf16, fp16, fp32 (not lora/qlora); inference also fp8, int8, int4.")] = "bf16",
    lora_rank: Annotated[int | None, typer.Option(
        "--lora-rank", help="lora/qlora: the adapters' rank, on every linear layer (default 16).")] = None,
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
        fail_usage("recommend", "--mode is required (train, finetune, lora, qlora or inference)")
    if top < 1:
        fail_usage("recommend", f"--top: must be >= 1, got {top}")
    try:
        workload = sizing.make_workload(params, mode, precision, seq_len, batch, max_nodes, layers, hidden,
                                        heads, kv_heads, model=model, concurrency=concurrency, vocab=vocab,
                                        tokens=tokens, mfu=mfu, lora_rank=lora_rank)
        unpriced = sizing.unpriced_types(region, zone)
        fits = sizing.recommend(workload, region, zone)
        hint = sizing.cheaper_precision(workload, fits, region, zone)
    except sizing.SizingError as err:
        fail_usage("recommend", str(err))
    if unpriced and unpriced == sizing.offered_types(region, zone):
        fail_usage("recommend", f"--region: {catalog.missing_prices_line(region)}")
    memory = sizing.estimate_memory(workload)
    snippet = sizing.recommendation_snippet(fits, workload, region, zone)
    on_demand = sizing.orderable(fits)
    served = concurrency_effect(workload, fits, region)
    if as_json:
        m = workload.model
        render.emit({
            "workload": {"model": m.name, "params": m.params, "active_params": m.active_params,
                         "mode": workload.mode, "precision": workload.precision,
                         "seq_len": workload.seq_len, "batch": workload.batch,
                         "concurrency": workload.concurrency, "max_nodes": workload.max_nodes,
                         "tokens": workload.tokens, "mfu": workload.mfu, "flops": workload.flops,
                         "lora_rank": workload.lora_rank if workload.mode in ("lora", "qlora") else None,
                         "region": region, "zone": zone,
                         "shape": {k: v for k, v in vars(m).items() if k != "given_params"}},
            "memory_gib": {k: round(v / sizing.GIB, 3) for k, v in vars(memory).items()},
            "fits": [{**vars(f), "usd_per_effective_tflop_hour": f.usd_per_effective_tflop_hour,
                      "headroom": round(f.headroom, 4), "tight": f.tight} for f in fits[:top]],
            "decode_bandwidth_utilisation": None if workload.training else sizing.DECODE_MBU,
            "on_demand_pick": None if on_demand is None else on_demand.instance_type,
            "unpriced_types": unpriced,
            "cheaper_precision": None if hint is None else {
                "precision": hint[0], "instance_type": hint[1].instance_type, "nodes": hint[1].nodes,
                "usd_per_million_tokens": hint[1].usd_per_million_tokens},
            "concurrency_effect": None if served is None else {
                "concurrency": served[0], "usd_per_million_tokens": served[1].usd_per_million_tokens,
                "tokens_per_second": served[1].tokens_per_second},
            "snippet": snippet})
    else:
        if unpriced:
            named = ", ".join(unpriced[:6]) + (f" and {len(unpriced) - 6} more" if len(unpriced) > 6 else "")
            render.say(f"recommend: left out, no price in {region}: {named} ({catalog.fetch_hint(region)})",
                       err=True)
        for line in render_recommendation(workload, memory, fits[:top], snippet, region, zone, hint, served):
            typer.echo(line)
    if not fits:
        raise typer.Exit(EXIT_BLOCKED)


def concurrency_effect(w: Workload, fits: list[Fit], region: str) -> tuple[int, Fit] | None:
    """Inference: the most sequences the best fit holds and that fit at them; None when no more fit."""
    from gpucluster import sizing

    if w.training or not fits:
        return None
    most = sizing.max_concurrency(w, fits[0])
    if most <= w.concurrency:
        return None
    at = sizing.at_concurrency(w, fits[0], most, region)
    return None if at is None or at.usd_per_million_tokens is None else (most, at)


def billions(value: float) -> str:
    return f"{value / 1e9:,.2f}B"


def render_recommendation(workload: Workload, memory: MemoryEstimate, fits: list[Fit],
                          snippet: str | None, region: str = "us-east-1", zone: str | None = None,
                          hint: tuple[str, Fit] | None = None,
                          served: tuple[int, Fit] | None = None) -> list[str]:
    """The human output of `gpucluster recommend`."""
    from gpucluster.sizing import CUDA_CONTEXT_GIB, DECODE_MBU, FRAGMENTATION, GIB, HEADROOM_CAUTION

    w, m = workload, workload.model
    per = (f"micro-batch {w.batch}" if w.training else f"{w.concurrency} concurrent sequences")
    active = f" ({billions(m.active_params)} active per token)" if m.active_params != m.params else ""
    out = [f"{m.name} {w.mode}, {w.precision}, sequence {w.seq_len}, {per}, at most {w.max_nodes} node(s); "
           f"{billions(m.params)} parameters{active}",
           f"shape: {m.layers} layers, hidden {m.hidden}, {m.heads} heads, {m.kv_heads} KV heads, vocabulary "
           f"{m.vocab} ({m.source})"]
    parts = [(label, getattr(memory, key) / GIB) for key, label in (
        ("weights", "frozen weights" if w.mode in ("lora", "qlora") else "weights"),
        ("adapters", f"rank-{w.lora_rank} adapters"), ("gradients", "gradients"),
        ("optimizer", "optimizer states"),
        ("buffers", "ZeRO-3 buffers"), ("overhead", "runtime overhead"), ("kv_cache", "KV cache"))
        if getattr(memory, key)]
    out.append("memory: " + " + ".join(f"{label} {gib:,.1f}" for label, gib in parts)
               + f" = {memory.sharded / GIB:,.1f} GiB spread over all GPUs"
               + (" (4-bit NF4 base, QLoRA)" if w.mode == "qlora" else " (16-bit base, LoRA)"
                  if w.mode == "lora" else " (ZeRO-3 / FSDP, as DeepSpeed's estimator counts)" if w.training
                  else ": each replica holds the weights over its own GPUs, and the KV cache of its "
                  "own sequences"))
    if w.training:
        out.append(f"  + per GPU: largest module {memory.largest_module / GIB:,.2f} GiB + activations "
                   f"{memory.activations / GIB:,.2f} GiB (full checkpointing) + logits "
                   f"{memory.logits / GIB:,.2f} GiB")
    out.append(f"  usable per GPU: its memory less {CUDA_CONTEXT_GIB:g} GiB CUDA context, less "
               f"{FRAGMENTATION * 100:g} % fragmentation; more than one node needs EFA on several "
               "network cards")
    where = f"zone {zone}" if zone else region
    if w.flops is not None and not w.training:
        out.append(f"job: {w.tokens:,.0f} generated tokens, at each type's decode rate below")
    elif w.flops is not None:
        out.append(f"job: {w.tokens:,.0f} tokens x {w.flops_per_token} x {billions(m.active_params)} "
                   f"parameters = {w.flops:,.3g} FLOPs at {w.mfu * 100:g} % of the GPUs' dense peak (MFU)")
    if not fits:
        out.append(f"nothing offered in {where} fits: raise --max-nodes, or lower --precision, --seq-len, "
                   "--batch or --concurrency, or try another --region")
        return render.wrap_lines(out)
    out = render.wrap_lines(out)
    if w.training:
        ranked = "the job's cost:" if w.flops is not None else "price per effective TFLOP-hour:"
    else:
        ranked = (f"the cost of a generated token (decode is bound by memory bandwidth: {DECODE_MBU:.0%} "
                  f"of the data sheet's, {w.concurrency} sequences at once):")
    out += ["", *render.wrap(f"types offered in {where}, ranked by {ranked}")]
    headers = ["#", "instance type", "nodes", "GPUs", "GiB/GPU", "$/h", "EFA", "eff"]
    headers += ([] if w.tokens is not None else ["TFLOPS"]) if w.training else ["TPxPP", "tok/s", "$/M tok"]
    headers += ["hours", "job $"] if w.tokens is not None else (["$/TFLOP-h"] if w.training else [])
    rows = []
    for i, f in enumerate(fits, 1):
        block = " CB" if f.price_basis == "capacity block" else ""
        row = [str(i), f.instance_type, str(f.nodes), f"{f.gpus} x {f.gpu_model}",
               f"{f.need_gib_per_gpu:.1f}/{f.usable_gib_per_gpu:.0f}" + ("!" if f.tight else ""),
               usd(f.usd_per_hour) + block, "yes" if f.efa else "not needed", f"{f.scaling_efficiency:.0%}"]
        if w.training:
            row += [f"{f.effective_tflops:,.0f}"] if w.tokens is None else []
        else:
            row += ["-" if f.tensor_parallel is None else f"{f.tensor_per_node}x{f.pipeline_parallel}",
                    "-" if f.tokens_per_second is None else f"{f.tokens_per_second:,.0f}",
                    "-" if f.usd_per_million_tokens is None else f"{f.usd_per_million_tokens:,.2f}"]
        if w.tokens is not None:
            row += ["-" if f.hours is None else f"{f.hours:,.1f}",
                    "-" if f.job_usd is None else usd(f.job_usd)]
        elif w.training:
            row += [f"{f.usd_per_effective_tflop_hour:.5f}"]
        rows.append(row)
    out += render.table(headers, rows)
    notes = ["GiB/GPU: what each GPU holds/usable; $/h: on-demand, all nodes (spot at the family's typical "
             "discount in --json); EFA: one node needs none"]
    if any(f.tight for f in fits):
        notes.append(f"!: under {HEADROOM_CAUTION:.0%} of the usable memory left: a framework's own "
                     "buffers or a longer sequence may not fit, prefer the next size")
    if w.training:
        notes.append("eff: share of a step computing, the rest waiting on ZeRO-3's gathers over the "
                     "slowest link (NVLink or PCIe in a node, EFA between nodes)")
        notes.append(f"TFLOPS: effective, all GPUs at {w.mfu:.0%} of their dense peak (MFU) x eff")
    else:
        notes.append("eff: share of a decode step not waiting on tensor-parallel all-reduces")
    if any(f.price_basis == "capacity block" for f in fits):
        notes.append("CB: sold only as a Capacity Block (its rate; `gpucluster capacity search`)")
    if not w.training:
        notes.append("TPxPP: GPUs of a node one replica shards over x nodes it spans as pipeline "
                     "stages (the rest serve more replicas)")
    out += render.wrap("; ".join(notes))
    best = fits[0]
    out += render.wrap(f"each GPU of the best fit ({best.nodes} x {best.instance_type}) holds: " + " + ".join(
        f"{part.replace('_', ' ')} {gib:,.2f}" for part, gib in best.held_gib.items())
        + f" = {best.need_gib_per_gpu:,.1f} of {best.usable_gib_per_gpu:,.1f} usable GiB")
    if not w.training:
        effect = (f"; {best.nodes} x {best.instance_type} holds up to {served[0]:,} at this sequence length: "
                  f"${served[1].usd_per_million_tokens:,.2f}/M tokens there, against "
                  f"${best.usd_per_million_tokens:,.2f} at {w.concurrency}" if served is not None
                  and served[1].usd_per_million_tokens is not None and best.usd_per_million_tokens is not None
                  else "")
        out += render.wrap(f"assumed: {w.concurrency} sequences decoded at once (--concurrency); a serving "
                           "engine batches as many as memory holds, and $/M tokens falls as it does" + effect)
    if hint is not None:
        alt = hint[1]
        out += render.wrap(f"cheaper at --precision {hint[0]}: {alt.nodes} x {alt.instance_type} at "
                           f"${alt.usd_per_million_tokens:,.2f}/M tokens, against "
                           f"${best.usd_per_million_tokens:,.2f} in {w.precision} (half the weight bytes; "
                           "check the quantised model's quality)")
    out += ["", "node group for the best fit (paste under `config:` in stacks/Pulumi.<env>.yaml):", ""]
    out += render.yaml_lines(snippet or "")
    return out


# -------------------------------------------------------------------------- init


def init(
    directory: Annotated[Path, typer.Argument(
        help="Where to create the project: a new or empty directory.")] = Path("."),
    hardened: Annotated[bool, typer.Option(
        "--hardened", help="Name a permissions boundary and a break-glass role in the dev stack and ship "
                           "the bootstrap script that makes the boundary (run it once per account first).")
    ] = False,
    scheduler: Annotated[str, typer.Option(
        "--scheduler", metavar="none|slurm|eks",
        help="slurm: the dev stack runs Slurm on AWS PCS (a partition per node group, a login node, "
             "jobs through sbatch); eks: Kubernetes on Amazon EKS (the node group joins the cluster, jobs "
             "queue in Kueue); none: gpucluster's own launcher.")] = "none",
    ami_id: Annotated[str | None, typer.Option(
        "--ami-id", metavar="AMI",
        help="With --scheduler slurm (required): the AMI the login and compute nodes boot, carrying the AWS "
             "PCS agent and Slurm 25.05.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Create a Pulumi project that uses gpucluster: Pulumi.yaml, __main__.py, a dev stack, policies."""
    from gpucluster.scaffold import ScaffoldError, create_project

    render.use_json(as_json)
    try:
        written = create_project(directory, hardened=hardened, scheduler=scheduler, ami_id=ami_id)
    except ScaffoldError as err:
        fail_usage("init", str(err))
    here = directory.resolve() == Path.cwd().resolve()
    next_step = f"{'' if here else f'cd {directory} && '}gpucluster plan dev"
    if as_json:
        render.emit({"directory": str(directory), "created": [str(p.relative_to(directory)) for p in written],
                     "hardened": hardened, "scheduler": scheduler, "next": next_step})
        raise typer.Exit(EXIT_OK)
    typer.echo(f"created a gpucluster project in {directory}:")
    for path in written:
        typer.echo(f"  {path.relative_to(directory)}")
    typer.echo("")
    if hardened:
        typer.echo("hardened: before the first `pulumi up`, an administrator runs infra/bootstrap_state.py "
                   "once per account (README.md)")
    if scheduler == "slurm":
        typer.echo(f"slurm: the dev stack runs Slurm on AWS PCS; its login and compute nodes boot {ami_id} "
                   "(gpucluster:scheduler.ami_id, README.md \"Jobs through Slurm\")")
    if scheduler == "eks":
        typer.echo("eks: the dev stack runs Kubernetes on Amazon EKS; its node group joins the cluster "
                   "(README.md \"Jobs on Kubernetes\")")
    typer.echo(f"next: {next_step}   (README.md has the steps to deploy)")


