"""The cost chart: a stack's monthly cost by strategy and by component, as a PNG.

It owns turning a priced stack (gpucluster.pricing.StackCost) into bars: all on-demand, the
stack's mix and all spot, at desired and at max nodes, each stacked by component (node
groups, EBS, NAT, FSx, S3). matplotlib is an optional extra imported only here, only when a
chart is drawn (Agg backend, no display), so `gpucluster plan` never pays for it. It never
prices anything itself.
"""

from __future__ import annotations

from pathlib import Path

from gpucluster.pricing import AT, STRATEGIES, STRATEGY_LABELS, At, StackCost, Strategy

Series = dict[At, dict[Strategy, list[tuple[str, float]]]]


class ChartUnavailable(RuntimeError):
    """matplotlib is not installed."""


def chart_series(cost: StackCost) -> Series:
    """USD/month per component for every (nodes, strategy) bar the chart draws."""
    return {at: {s: cost.components(at, s) for s in STRATEGIES} for at in AT}


def draw_chart(cost: StackCost, path: Path) -> Series:
    """Write the chart to `path` (PNG) and return the figures drawn."""
    try:
        import matplotlib
    except ImportError:
        raise ChartUnavailable("--chart needs matplotlib: pip install -e '.[chart]'") from None
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

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
