"""A node group's warm pool in numbers: how many stopped instances it keeps, and what they cost against
the billed boot minutes they save (pure: the cost model, `pricing`, prices them with its own rates).

Auto Scaling bills a Stopped warm instance for its EBS volumes only, and a node it starts from the
pool skips the cold launch's first boot (EC2 Auto Scaling user guide, "Warm pools for Amazon EC2 Auto
Scaling"; not re-read from this machine: ledger: warm-pool-limits). Instance time is billed from
`running`, so every boot minute saved is a billed minute saved.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpucluster.spec import NodeGroupConfig

# A node Auto Scaling starts from a warm pool (stopped, its hook already passed once, its root volume
# already read) against one launched cold from the baked image: modelled, not measured.
WARM_START_SAVES_MINUTES = 3.0
WARM_START_BASIS = ("a cold baked node is ready 3.5-5 min after `running` (benchmarks/boot_time.py), a "
                    "warm start skips the first boot's cloud-init, bundle and volume initialization")


def warm_pool_nodes(group: NodeGroupConfig, nodes: int) -> int:
    """Stopped instances a group's warm pool keeps while `nodes` run: its maximum prepared capacity
    (default the group's max_nodes) less the running nodes, at least min_size (EC2 Auto Scaling user
    guide, "Warm pools for Amazon EC2 Auto Scaling": warm pool size)."""
    pool = group.warm_pool
    if pool is None:
        return 0
    cap = pool.max_prepared if pool.max_prepared is not None else group.max_nodes
    return max(pool.min_size, cap - nodes)


@dataclass(frozen=True)
class WarmPoolTradeoff:
    """What a group's warm pool costs against the billed boot minutes it saves (modelled)."""

    stopped_usd_per_month: float
    """The pool's stopped root volumes at desired nodes (EBS only: no instance hours)."""
    minutes_saved_per_node: float
    node_usd_per_hour: float
    basis: str

    @property
    def usd_saved_per_node_start(self) -> float:
        """The instance time a node started warm does not spend booting (billed from `running`)."""
        return self.minutes_saved_per_node / 60 * self.node_usd_per_hour

    @property
    def break_even_node_starts_per_month(self) -> float:
        """Warm node starts a month at which the pool pays for itself (below: it costs more than it saves)."""
        saved = self.usd_saved_per_node_start
        return self.stopped_usd_per_month / saved if saved else float("inf")


def warm_pool_tradeoff(group: NodeGroupConfig, gp3_usd_per_gb_month: float, node_usd_per_hour: float,
                       minutes_saved: float = WARM_START_SAVES_MINUTES) -> WarmPoolTradeoff | None:
    """The group's warm pool priced against what it saves: each node Auto Scaling starts from the pool
    instead of launching skips the first boot's billed minutes; None without a pool."""
    if group.warm_pool is None:
        return None
    gp3 = gp3_usd_per_gb_month
    size = group.root_volume_size_gib
    stopped = warm_pool_nodes(group, group.desired_nodes)
    return WarmPoolTradeoff(stopped * size * gp3, minutes_saved, node_usd_per_hour,
                            f"{stopped} stopped x {size} GiB gp3 x ${gp3}/GB-month against "
                            f"{minutes_saved:g} min of billed boot saved per node started warm "
                            f"(modelled: {WARM_START_BASIS}) x ${node_usd_per_hour:,.2f}/node-hour")


def warm_pool_basis(group: NodeGroupConfig, gp3_usd_per_gb_month: float,
                    node_usd_per_hour: float | None) -> str:
    """The `Warm pool <group>` cost line's basis: what is stopped, and (priced nodes, a pool at desired
    nodes) from how many warm node starts a month it pays for itself."""
    size, gp3 = group.root_volume_size_gib, gp3_usd_per_gb_month
    at_desired, at_max = warm_pool_nodes(group, group.desired_nodes), warm_pool_nodes(group, group.max_nodes)
    basis = (f"{at_desired} stopped ({at_max} at max nodes) x {size} GiB gp3 x ${gp3}/GB-month; stopped "
             "instances bill EBS only")
    trade = warm_pool_tradeoff(group, gp3, node_usd_per_hour) if node_usd_per_hour is not None else None
    if trade is not None and at_desired:
        basis += (f"; each node started warm saves ~{trade.minutes_saved_per_node:g} billed boot minutes "
                  f"(${trade.usd_saved_per_node_start:,.2f}): pays for itself above "
                  f"{trade.break_even_node_starts_per_month:,.0f} warm node starts a month")
    return basis
