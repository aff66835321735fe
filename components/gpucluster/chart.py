"""The cost charts, as PNGs: a stack's monthly cost by strategy and component, and its spend per day.

It owns turning a priced stack (gpucluster.pricing.StackCost) into bars: all on-demand, the
stack's mix and all spot, at desired and at max nodes, each stacked by component (node
groups, EBS, NAT, FSx, S3); and a spend report (gpucluster.ops.spend.Spend) into daily bars
of the actual cost, stacked by node group, against the estimate's line. matplotlib is an
optional extra imported only here, only when a chart is drawn (Agg backend, no display), so
`gpucluster plan` never pays for it. It never prices or queries anything itself.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucluster.pricing import AT, STRATEGIES, STRATEGY_LABELS, At, StackCost, Strategy

if TYPE_CHECKING:
    from gpucluster.ops.spend import Spend

Series = dict[At, dict[Strategy, list[tuple[str, float]]]]


class ChartUnavailable(RuntimeError):
    """matplotlib is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        from gpucluster.installed import direct_url, extra_install_command

        hint = extra_install_command("chart", direct_url(), Path.cwd())
        raise ChartUnavailable(f"--chart needs matplotlib: {hint}") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    return plt


def chart_series(cost: StackCost) -> Series:
    """USD/month per component for every (nodes, strategy) bar the chart draws."""
    return {at: {s: cost.components(at, s) for s in STRATEGIES} for at in AT}


def draw_chart(cost: StackCost, path: Path) -> Series:
    """Write the chart to `path` (PNG) and return the figures drawn."""
    plt = _pyplot()
    series = chart_series(cost)
    names = [name for name, _ in series["desired"]["mix"]]
    colours = plt.get_cmap("tab20").colors
    fig, axes = plt.subplots(1, len(AT), figsize=(11, 5.5), sharey=True)
    for ax, at in zip(axes, AT, strict=True):
        labels = [STRATEGY_LABELS[s] for s in STRATEGIES]
        bottoms = [0.0] * len(STRATEGIES)
        for i, name in enumerate(names):
            heights = [dict(series[at][s])[name] for s in STRATEGIES]
            ax.bar(labels, heights, bottom=bottoms, color=colours[i % len(colours)],
                   label=name if at == AT[0] else None)
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
        for x, total in enumerate(bottoms):
            ax.annotate(f"${total:,.0f}", (x, total), ha="center", va="bottom", fontsize=9)
        ax.set_title(f"at {at} nodes")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("USD per month")
    axes[0].yaxis.set_major_formatter(lambda value, _pos: f"${value:,.0f}")
    if cost.budget_usd_per_month is not None:
        for ax in axes:
            ax.axhline(cost.budget_usd_per_month, color="crimson", linestyle="--", linewidth=1)
        axes[-1].annotate("budget", (len(STRATEGIES) - 0.6, cost.budget_usd_per_month), color="crimson",
                          va="bottom", fontsize=9)
    fig.suptitle(f"gpucluster stack {cost.stack} ({cost.region}): monthly cost by strategy and component")
    fig.legend(loc="lower center", ncol=min(3, len(names)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08 + 0.03 * (len(names) // 3), 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return series


SpendSeries = dict[str, Any]


def spend_series(spend: Spend) -> SpendSeries:
    """Per UTC day: the actual cost of each node group (and the non-GPU remainder), and the estimate."""
    days = spend.window.days
    by: dict[str, dict[date, float]] = {}
    for row in spend.rows:
        name = f"node group {row.node_group}" if row.node_group else "non-GPU remainder"
        by.setdefault(name, dict.fromkeys(days, 0.0))
        if row.start in by[name]:
            by[name][row.start] += row.usd
    names = sorted(n for n in by if n != "non-GPU remainder") + (
        ["non-GPU remainder"] if "non-GPU remainder" in by else [])
    return {"days": days, "actual": [(n, [by[n][d] for d in days]) for n in names],
            "estimate": [spend.estimate.by_day.get(d, 0.0) for d in days]}


def draw_spend_chart(spend: Spend, path: Path) -> SpendSeries:
    """Write actual (bars by node group) against estimate (line) per day to `path`; return the figures."""
    plt = _pyplot()
    series = spend_series(spend)
    labels = [d.strftime("%m-%d") for d in series["days"]]
    colours = plt.get_cmap("tab20").colors
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(labels) + 3), 5.5))
    bottoms = [0.0] * len(labels)
    for i, (name, values) in enumerate(series["actual"]):
        ax.bar(labels, values, bottom=bottoms, color=colours[i % len(colours)], label=f"actual: {name}")
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax.plot(labels, series["estimate"], color="black", marker="o", linewidth=1.5,
            label="estimate (as scheduled, desired nodes)")
    ax.set_ylabel("USD per day")
    ax.yaxis.set_major_formatter(lambda value, _pos: f"${value:,.0f}")
    ax.grid(axis="y", alpha=0.3)
    if len(labels) > 14:
        ax.set_xticks(range(0, len(labels), max(1, len(labels) // 14)))
    waste = spend.waste.idle_usd
    ax.set_title(f"gpucluster stack {spend.stack} ({spend.region}): actual ${spend.actual:,.0f} against "
                 f"estimate ${spend.estimate.total:,.0f}; idle waste ${waste:,.0f}")
    fig.legend(loc="lower center", ncol=min(3, len(series["actual"]) + 1), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1 + 0.03 * (len(series["actual"]) // 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return series
