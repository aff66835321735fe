"""Named checks of the `node_groups` section: counts, zones, EFA and placement, offerings, capacity,
AMIs, the group's own files and setup, MIG layouts and health checks.

Each check is a small function returning findings (registered with `@check`/`@group_check`, in the
order they report). It must never render user data or import Pulumi: the rendered size is checked
by `gpucluster.preflight`.
"""

from __future__ import annotations

import difflib
import gzip
from collections.abc import Iterable, Mapping, Sequence

from gpucluster import catalog
from gpucluster.spec.checks import check, group_check, unique_name_findings
from gpucluster.spec.fields import ZONE_NAME, number_text
from gpucluster.spec.files import ProjectFileError, read_project_file
from gpucluster.spec.findings import Finding
from gpucluster.spec.models import (
    MIG_LAUNCH_TIMEOUT_MINUTES,
    MIG_MIN_LAUNCH_TIMEOUT_MINUTES,
    NodeGroupConfig,
    StackSpec,
)


@check
def node_group_names_unique(spec: StackSpec) -> Iterable[Finding]:
    yield from unique_name_findings([g.name for g in spec.node_groups], "node_groups", "node group")


@group_check
def group_counts(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    if not g.min_nodes <= g.desired_nodes <= g.max_nodes:
        yield Finding(path, f"need min_nodes <= desired_nodes <= max_nodes, got "
                      f"{g.min_nodes} <= {g.desired_nodes} <= {g.max_nodes}")
    if g.capacity.on_demand_base > g.max_nodes:
        yield Finding(f"{path}.capacity.on_demand_base",
                      f"must be <= max_nodes ({g.max_nodes}), got {g.capacity.on_demand_base}")



@check
def node_group_zones(spec: StackSpec) -> Iterable[Finding]:
    for i, g in enumerate(spec.node_groups):
        yield from group_zone_findings(g.availability_zones or [], spec.network.availability_zones,
                                       f"node_groups[{i}]")


def group_zone_findings(group_zones: Sequence[str], network_zones: Sequence[str], path: str,
                        network_key: str = "network.availability_zones") -> Iterable[Finding]:
    """A group runs only in zones the network has."""
    for j, az in enumerate(group_zones):
        if az not in network_zones:
            yield Finding(f"{path}.availability_zones[{j}]", f"{az!r} is not in {network_key}")


@group_check
def group_efa(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """EFA on: every type supports it, all share one NIC layout, one zone, one subnet."""
    if g.efa == "on":
        for j, t in enumerate(g.types):
            if not t.supports_efa:
                yield Finding(f"{path}.instance_types[{j}]",
                              f"{t.name} does not support EFA (efa: on); use efa: off or an "
                              "EFA-capable type")
    if g.efa_enabled:
        layouts = {(t.network_cards, t.efa_interface_count) for t in g.types}
        if len(layouts) > 1:
            yield Finding(f"{path}.instance_types",
                          "EFA groups share one launch template, so every type needs the same "
                          "network cards and EFA interfaces; got " + ", ".join(
                              f"{t.name}={t.efa_interface_count}" for t in g.types))
    yield from single_zone_findings(g.efa_enabled, bool(g.placement_group), zones, path)


def single_zone_findings(efa: bool, placement_group: bool, zones: Sequence[str] | None,
                         path: str) -> Iterable[Finding]:
    """EFA and cluster placement groups live in one availability zone (and one subnet)."""
    if zones is None:
        return
    if efa and len(zones) != 1:
        yield Finding(f"{path}.availability_zones",
                      "EFA needs exactly one availability zone and subnet (cluster "
                      f"placement group); got {len(zones)}")
    if placement_group and len(zones) != 1:
        yield Finding(f"{path}.placement_group",
                      "a cluster placement group lives in one availability zone; "
                      f"the group has {len(zones)}")



def _zones_text(zones: Sequence[str]) -> str:
    return ", ".join(zones) if zones else "none"


def _regions_text(region: str, offered: Mapping[str, Sequence[str]], shown_at_most: int = 2) -> str:
    """Regions offering a type, those of `region`'s geography first (us-, eu-, ...), a few by name:
    an error line stays readable (MAX_LINE_CHARS) however many regions there are."""
    geography = region.split("-", 1)[0]
    regions = sorted((r for r, zones in offered.items() if zones),
                     key=lambda r: (r.split("-", 1)[0] != geography, r))
    if not regions:
        return "none"
    more = len(regions) - shown_at_most
    return ", ".join(regions[:shown_at_most]) + (f" and {more} more regions" if more > 0 else "")


@group_check
def group_offered(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """The first type is offered in every zone of the group (error); each fallback too (warning).

    From catalog/data/offerings.yaml (AWS DescribeInstanceTypeOfferings as moto ships it): an ASG
    whose type is not offered in its zone never launches a node. A region the file does not
    cover is not checked; `gpucluster doctor` asks the account itself.
    """
    if not zones:
        return
    _, as_of = catalog.offerings_source()
    for j, name in enumerate(g.instance_types):
        missing = {az: offered for az in zones if isinstance(az, str) and ZONE_NAME.fullmatch(az)
                   and (offered := catalog.offered_zones(name, az[:-1])) is not None and az not in offered}
        if not missing:
            continue
        region = next(iter(missing))[:-1]
        offered = catalog.offered_zones(name, region) or []
        where = (f"in {region} it is offered in {_zones_text(offered)}" if offered else
                 f"no {region} zone offers it; {_regions_text(region, catalog.offered_anywhere(name))} do")
        if j == 0:
            yield Finding(f"{path}.instance_types[0]", f"{name} is not offered in {', '.join(missing)}; "
                          f"{where} (offerings as of {as_of})")
        else:
            yield Finding(f"{path}.instance_types[{j}]", f"fallback {name} is not offered in "
                          f"{', '.join(missing)}, so the group never launches it there; {where}",
                          level="warning")



@group_check
def group_efa_spot(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """A multi-node EFA group that can hold spot nodes: one interruption stalls every rank (warning)."""
    cap = g.capacity
    if g.efa_enabled and g.max_nodes > 1 and cap.market == "mixed" and cap.spot_percent > 0 \
            and g.max_nodes > cap.on_demand_base:
        yield Finding(f"{path}.capacity.spot_percent",
                      f"a multi-node EFA group holds spot nodes ({number_text(cap.spot_percent)} % above the "
                      "base): one reclaimed node stops the whole collective job, and its replacement "
                      "is not placed near the others; run multi-node EFA training on-demand or on a "
                      "Capacity Block, and single-node work on spot in a group of its own",
                      level="warning")



@group_check
def group_capacity(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    cap, cap_path = g.capacity, f"{path}.capacity"
    if cap.market == "capacity_block":
        if cap.capacity_reservation_id is None:
            yield Finding(f"{cap_path}.capacity_reservation_id",
                          "a capacity block needs its reservation id (cr-...)")
        if cap.spot_percent:
            yield Finding(f"{cap_path}.spot_percent",
                          "capacity blocks have no spot share; must be 0, got "
                          f"{number_text(cap.spot_percent)}")
        if len(g.instance_types) != 1:
            yield Finding(f"{path}.instance_types",
                          "a capacity block is for exactly one instance type, got "
                          f"{len(g.instance_types)}")
        for j, t in enumerate(g.types):
            if not t.family.capacity_blocks:
                yield Finding(f"{path}.instance_types[{j}]",
                              f"{t.name} cannot be bought as a Capacity Block for ML")
    elif not float(cap.spot_percent).is_integer():
        yield Finding(f"{cap_path}.spot_percent", "Auto Scaling splits on-demand and spot in whole "
                      f"percent; use a whole number, got {number_text(cap.spot_percent)}")
    if cap.market != "capacity_block" and cap.duration_hours is not None:
        yield Finding(f"{cap_path}.duration_hours", "only used with market: capacity_block")
    if cap.market != "capacity_block" and cap.instance_count is not None:
        yield Finding(f"{cap_path}.instance_count", "only used with market: capacity_block")
    elif cap.instance_count is not None and g.max_nodes > cap.instance_count:
        # A Capacity Block holds the instances bought, no more: a launch beyond them fails for want of
        # capacity (EC2 user guide, "Capacity Blocks for ML").
        yield Finding(f"{path}.max_nodes", f"the Capacity Block holds {cap.instance_count} instances "
                      f"(capacity.instance_count): must be <= {cap.instance_count}, got {g.max_nodes}")
    elif cap.duration_hours is not None:
        yield from _block_duration(cap.duration_hours, f"{cap_path}.duration_hours")
    if cap.market == "mixed" and cap.capacity_reservation_id and cap.on_demand_base == 0 \
            and cap.spot_percent == 100:
        yield Finding(f"{cap_path}.capacity_reservation_id", "a capacity reservation serves "
                      "on-demand nodes, but on_demand_base is 0 and spot_percent is 100")
    if cap.capacity_reservation_id and zones is not None and len(zones) != 1:
        yield Finding(f"{path}.availability_zones", "a capacity reservation lives in "
                      "one availability zone; give the group exactly one (the reservation's)")
    if cap.base_commitment != "none" and cap.on_demand_base == 0:
        yield Finding(f"{cap_path}.base_commitment",
                      f"{cap.base_commitment} covers the on-demand base, but on_demand_base is 0")


def _block_duration(hours: int, path: str) -> Iterable[Finding]:
    """EC2 API reference, DescribeCapacityBlockOfferings CapacityDurationHours: whole days up to
    14 days, then whole weeks up to 182 days."""
    if hours % 24 or (hours > 14 * 24 and hours % (7 * 24)):
        yield Finding(path, "a Capacity Block lasts whole days up to 14 days (336 h), then whole weeks "
                      f"up to 182 days (4368 h), got {hours}")


# AWS ParallelCluster rejects a placement group with Capacity Blocks: their instances are already
# placed in an EC2 UltraCluster (ParallelCluster user guide, "Using Amazon EC2 Capacity Blocks for ML").
CAPACITY_BLOCK_PLACEMENT = ("a Capacity Block's instances are already placed together in an EC2 "
                            "UltraCluster; it takes no placement group (AWS ParallelCluster rejects one too)")


@group_check
def group_placement(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    if g.capacity.market == "capacity_block" and g.placement_group:
        yield Finding(f"{path}.placement_group", f"{CAPACITY_BLOCK_PLACEMENT}; remove placement_group")



@group_check
def group_ami(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    if g.ami_id and g.ami_ssm_parameter:
        yield Finding(f"{path}.ami_id", "set ami_id or ami_ssm_parameter, not both")


# Paths the bootstrap owns: a user file there would be overwritten, or would overwrite ours.
RESERVED_NODE_PATHS = ("/etc/gpucluster/", "/usr/local/sbin/gpucluster-", "/etc/systemd/system/gpucluster-",
                       "/opt/aws/amazon-cloudwatch-agent/", "/etc/profile.d/gpucluster-",
                       "/usr/local/lib/gpucluster/")  # the node scripts bundle, unpacked
# EC2 user data is 16 KiB gzipped in all (EC2 user guide, "Run commands at launch"); the bootstrap's
# settings, units and loader take about 4 KiB of it with a MIG layout, health checks and metrics (the
# scripts ship in the node scripts bundle), the group's own files and setup may take this much (and
# `user_data_size` checks the whole, rendered).
NODE_SETUP_MAX_GZIP_BYTES = 4096


@group_check
def group_node_setup(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """Setup and files: one source each, readable, not on the bootstrap's paths, within user data."""
    if g.setup and g.setup_script:
        yield Finding(f"{path}.setup_script", "set setup (commands) or setup_script (a file), not both")
    texts: list[str] = list(g.setup)
    if g.setup_script:
        try:
            texts.append(read_project_file(g.setup_script))
        except ProjectFileError as err:
            yield Finding(f"{path}.setup_script", str(err))
    seen: set[str] = set()
    for j, f in enumerate(g.files):
        where = f"{path}.files[{j}]"
        if (f.content is None) == (f.source is None):
            yield Finding(where, "set exactly one of content or source")
        if f.path in seen:
            yield Finding(f"{where}.path", f"{f.path} is written twice")
        seen.add(f.path)
        if f.path.startswith(RESERVED_NODE_PATHS) or f.path.rstrip("/") + "/" in RESERVED_NODE_PATHS:
            yield Finding(f"{where}.path", f"{f.path} is where gpucluster's own node files go; "
                          "choose another path (e.g. under /opt)")
        text = f.content
        if f.source is not None:
            try:
                text = read_project_file(f.source)
            except ProjectFileError as err:
                yield Finding(f"{where}.source", str(err))
        if text is not None:
            texts.append(text)
    size = len(gzip.compress("\n".join(texts).encode(), mtime=0))
    if size > NODE_SETUP_MAX_GZIP_BYTES:
        yield Finding(f"{path}.files", f"files and setup take {size} bytes gzipped; EC2 user data leaves "
                      f"them {NODE_SETUP_MAX_GZIP_BYTES}: keep large files in S3 and fetch them in setup")


def mig_instance_types() -> list[str]:
    """Families whose GPUs have MIG (catalog/data/mig_profiles.yaml), in catalog order."""
    return list(dict.fromkeys(catalog.family_of(n) for n in catalog.names() if catalog.mig_gpu(n)))


def _layout_text(layout: Sequence[str]) -> str:
    """['1g.10gb'] * 7 -> '7 x 1g.10gb'; a mixed layout -> its names, comma separated."""
    return f"{len(layout)} x {layout[0]}" if len(set(layout)) == 1 else ", ".join(layout)


def mig_layout_findings(gpu: catalog.MigGpu, instance_type: str, layout: Sequence[str],
                        path: str) -> Iterable[Finding]:
    """One GPU's layout against its profiles: known names, instance limits, slices and placements."""
    unknown = [n for n in dict.fromkeys(layout) if n not in gpu.profiles]
    if unknown:
        hint = difflib.get_close_matches(unknown[0], list(gpu.profiles), n=1, cutoff=0.6)
        tail = f"; did you mean {hint[0]}?" if hint else ""
        yield Finding(path, f"{unknown[0]} is not a MIG profile of {instance_type}'s {gpu.name} (it has "
                      f"{', '.join(gpu.profiles)}){tail}")
        return
    for name in dict.fromkeys(layout):
        most = gpu.profiles[name].max_instances
        if layout.count(name) > most:
            yield Finding(path, f"one {gpu.name} ({instance_type}) holds at most {most} x {name}, "
                          f"got {layout.count(name)}")
            return
    if gpu.place(layout) is not None:
        return
    compute = sum(gpu.profiles[n].compute_slices for n in layout)
    memory = sum(gpu.profiles[n].memory_slices for n in layout)
    if compute > gpu.compute_slices:
        why = f"they need {compute} of its {gpu.compute_slices} compute slices"
    elif memory > gpu.memory_slices:
        why = f"they need {memory} of its {gpu.memory_slices} memory slices"
    else:
        why = "no placement lets them sit side by side (3g and 4g instances start at slice 0 or 4 only)"
    yield Finding(path, f"{_layout_text(layout)} do not fit one {gpu.name} ({instance_type}): {why}")


@group_check
def group_mig(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """A MIG layout names one profile (with a count) or a list, which every type's GPU can hold.

    From catalog/data/mig_profiles.yaml (NVIDIA's MIG user guide): GPUs without MIG (T4, A10G, L4,
    L40S) refuse any layout; the others take only their own profile names, at most their instance
    limit each, within 7 compute slices and on placements that do not overlap.
    """
    m, where = g.mig, f"{path}.mig"
    if m is None:
        return
    if (m.profile is None) == (m.profiles is None):
        yield Finding(where, "set profile (with an optional count) or profiles (a list per GPU)"
                      + (", not both" if m.profile else ""))
        return
    if m.count is not None and m.profile is None:
        yield Finding(f"{where}.count", "only used with profile (profiles lists every instance of a GPU)")
        return
    key = f"{where}.profile" if m.profile else f"{where}.profiles"
    fits: dict[str, int] = {}
    seen: set[str] = set()
    for j, t in enumerate(g.types):
        gpu = catalog.mig_gpu(t.name)
        if gpu is None:
            families = ", ".join(mig_instance_types())
            yield Finding(f"{path}.instance_types[{j}]", f"{t.name} has {t.gpu_model} GPUs, which have no "
                          f"MIG; a mig layout needs A100, H100, H200 or B200 ({families})")
            continue
        if m.profile is not None and m.profile in gpu.profiles:
            fits[t.name] = gpu.profiles[m.profile].max_instances
            if m.count is not None and m.count > fits[t.name]:
                yield Finding(f"{where}.count", f"one {gpu.name} ({t.name}) holds at most {fits[t.name]} x "
                              f"{m.profile}, got {m.count}")
                continue
        if gpu.name in seen:
            continue
        seen.add(gpu.name)
        layout = m.profiles or [str(m.profile)] * (m.count or fits.get(t.name, 1))
        yield from mig_layout_findings(gpu, t.name, layout, key)
    if m.profile is not None and m.count is None and len(set(fits.values())) > 1:
        yield Finding(f"{where}.count", f"required here: the group's types fit different numbers of "
                      f"{m.profile} per GPU ({', '.join(f'{t}: {n}' for t, n in fits.items())})")



@check
def mig_idle_stop(spec: StackSpec) -> Iterable[Finding]:
    """The idle stop reads GPU utilisation, which a GPU in MIG mode does not report (warning)."""
    if not spec.autostop.enabled:
        return
    for i, g in enumerate(spec.node_groups):
        if g.mig is not None:
            yield Finding(f"node_groups[{i}].mig", "GPUs in MIG mode report no utilisation (NVML), so the "
                          "idle stop never sees this group idle (its alarm stays INSUFFICIENT_DATA and only "
                          "notifies); bound it with autostop.stop_schedule or max_lifetime_hours",
                          level="warning")


@group_check
def group_health(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    h = g.health_checks
    if h.enabled and h.xid_window_minutes < h.interval_minutes:
        # A window shorter than the interval leaves minutes no check ever looks at.
        yield Finding(f"{path}.health_checks.xid_window_minutes",
                      f"must be at least interval_minutes ({h.interval_minutes}), or an XID between "
                      f"two checks is never seen; got {h.xid_window_minutes}")
    if h.enabled and g.mig is not None and h.dcgm_diag and "dcgm_diag" in h.model_fields_set:
        yield Finding(f"{path}.health_checks.dcgm_diag", "not run on a MIG group: DCGM's diagnostic on "
                      "GPUs in MIG mode is unverified here; "  # ledger: dcgm-diag-mig
                      "the mig finding checks the layout instead",
                      level="warning")
    if h.enabled and g.mig is not None and g.launch_timeout_minutes < MIG_MIN_LAUNCH_TIMEOUT_MINUTES:
        yield Finding(f"{path}.health_checks.launch_timeout_minutes",
                      f"must be at least {MIG_MIN_LAUNCH_TIMEOUT_MINUTES} in a MIG group: a node's first "
                      "boot may reboot once to turn MIG mode on before its check can answer (default "
                      f"{MIG_LAUNCH_TIMEOUT_MINUTES}); got {g.launch_timeout_minutes}")
