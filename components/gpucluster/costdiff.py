"""The Markdown difference between two priced stacks (`gpucluster cost --diff`): base -> head, per line.

Reads the cost documents `gpucluster cost --json` and `gpucluster plan --json` print
(`pricing.StackCost.as_json`). Pure: no Pulumi, no AWS call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucluster.pricing import AT, PricingError


def cost_document(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """The cost part of a `plan --json` (its `cost` key) or `cost --json` document."""
    cost = doc.get("cost", doc)
    if not isinstance(cost, Mapping) or "totals" not in cost:
        reason = cost.get("error") if isinstance(cost, Mapping) else None
        raise PricingError(reason or "not a cost document (expected `gpucluster cost --json` or "
                           "`gpucluster plan --json` output)")
    return cost


def _money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.2f}"


def _change(base: float | None, head: float | None) -> str:
    if base is None:
        return "new"
    if head is None:
        return "removed"
    delta = head - base
    if abs(delta) < 0.005:
        return "no change"
    pct = f" ({100 * delta / base:+.1f} %)" if base else ""
    return f"{'+' if delta > 0 else '-'}${abs(delta):,.2f}{pct}"


def _scheduled(cost: Mapping[str, Any]) -> bool:
    return "scheduled_totals" in cost


def cost_diff_markdown(base_doc: Mapping[str, Any], head_doc: Mapping[str, Any]) -> str:
    """A Markdown cost difference for a pull-request comment (monthly, USD).

    Led by the scheduled figure (the hours the stack is configured to run) when both
    documents carry it; 24 x 7 follows, then every component that changed.
    """
    base, head = cost_document(base_doc), cost_document(head_doc)
    title = base["stack"] if base["stack"] == head["stack"] else f"{base['stack']} -> {head['stack']}"
    scheduled = _scheduled(base) and _scheduled(head)
    hours = head.get("schedule", {}).get("hours_per_month", head["hours_per_month"]) if scheduled \
        else head["hours_per_month"]
    lead = (f"Monthly cost in USD as scheduled ({hours:g} hours a month; 24 x 7 is "
            f"{head['hours_per_month']} hours), base -> head." if scheduled else
            f"Monthly cost in USD ({head['hours_per_month']} hours a month), base -> head.")
    lines = [f"### gpucluster cost: {title}", "", lead, "",
             "| | base | head | change |", "|---|---:|---:|---:|"]
    if scheduled:
        for at in AT:
            b = base["scheduled_totals"][at]["mix"]["usd_per_month"]
            h = head["scheduled_totals"][at]["mix"]["usd_per_month"]
            lines.append(f"| **total at {at} nodes, as scheduled** | {_money(b)} | {_money(h)} | "
                         f"**{_change(b, h)}** |")
    for at in AT:
        b, h = base["totals"][at]["mix"]["usd_per_month"], head["totals"][at]["mix"]["usd_per_month"]
        label = f"total at {at} nodes, 24 x 7" if scheduled else f"**total at {at} nodes**"
        change = _change(b, h) if scheduled else f"**{_change(b, h)}**"
        lines.append(f"| {label} | {_money(b)} | {_money(h)} | {change} |")
    for at in AT:
        b, h = (base["totals"][at]["all_on_demand"]["usd_per_month"],
                head["totals"][at]["all_on_demand"]["usd_per_month"])
        lines.append(f"| same capacity all on-demand, {at}, 24 x 7 | {_money(b)} | {_money(h)} | "
                     f"{_change(b, h)} |")
    key = "scheduled_components" if scheduled else "components"
    before = {c["name"]: c["usd_per_month"] for c in base[key]}
    after = {c["name"]: c["usd_per_month"] for c in head[key]}
    names = list(before) + [n for n in after if n not in before]
    suffix = ", as scheduled" if scheduled else ""
    for at in AT:
        for name in names:
            b = before[name][at] if name in before else None
            h = after[name][at] if name in after else None
            if b is None or h is None or abs(h - b) >= 0.005:
                lines.append(f"| {name}, {at}{suffix} | {_money(b)} | {_money(h)} | {_change(b, h)} |")
    saving_b, saving_h = base["saving_vs_on_demand_percent"], head["saving_vs_on_demand_percent"]
    lines += ["", "Saving against all on-demand: " + ", ".join(
        f"{at} {saving_b[at]:.1f} % -> {saving_h[at]:.1f} %" for at in AT) + "."]
    if scheduled and base["schedule"]["basis"] != head["schedule"]["basis"]:
        lines += ["", f"Schedule: {base['schedule']['basis']} -> {head['schedule']['basis']}."]
    if head["warnings"]:
        lines += ["", *[f"> warning: {w}" for w in head["warnings"]]]
    return "\n".join(lines) + "\n"
