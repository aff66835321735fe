"""A smoke test of a node group's fabric: NCCL's all-reduce benchmark across its nodes.

This backs `gpucluster run STACK --group G --nccl-test`. It runs nccl-tests'
all_reduce_perf (shipped with the Deep Learning AMI; see node/nccl-test.sh for
where, and why SSH is opened inside the group for the test's duration) under
Open MPI on every in-service node of the group, one GPU per rank, and reads
the bus bandwidth it reports per message size. The peak is compared with what
the instance type's network should give (the catalog's `network_gbps`, the EFA
bandwidth of EFA types, over 8 for GB/s): for all-reduce, nccl-tests' busbw is
normalised so it approaches the bottleneck link's bandwidth (nccl-tests,
doc/PERFORMANCE.md, "Bus bandwidth"), which across nodes is the node's network.
Two nodes with NCCL's tree algorithm can report more than the network
(nccl-tests issue #22): above 100 % is not an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpucluster import catalog
from gpucluster.node.userdata import script
from gpucluster.noderole import run_log_group_name
from gpucluster.ops import Clients, Spinner, no_spinner
from gpucluster.ops.launch import find_nodes, group_environment
from gpucluster.ops.nodes import Node
from gpucluster.ops.run import (
    JobPlan,
    JobResult,
    NodeResult,
    RankedNode,
    RunError,
    plan_job,
    send_job,
    wait_job,
)

if TYPE_CHECKING:
    from gpucluster.spec import StackSpec

NCCL_SCRIPT = script("nccl-test.sh")
PHASE_TIMEOUT_SECONDS = 120
RUN_TIMEOUT_SECONDS = 1800
DEFAULT_MAX_BYTES = "4G"
MIN_FRACTION = 0.5
"""A multi-node peak below half of the network's bandwidth fails the test: a fabric problem
(EFA not used, nodes outside the placement group), not noise."""
MAX_BYTES = re.compile(r"[1-9][0-9]{0,3}[KMG]?")


@dataclass(frozen=True)
class BusRow:
    """One message size of all_reduce_perf's table."""

    size: int
    """Bytes."""
    dtype: str
    busbw_out_of_place: float
    busbw_in_place: float
    """GB/s, as nccl-tests prints them."""
    wrong: int
    """Wrong values found (both columns; 0 when the test ran without checking)."""

    @property
    def busbw(self) -> float:
        return max(self.busbw_out_of_place, self.busbw_in_place)


@dataclass(frozen=True)
class NcclReport:
    rows: list[BusRow]
    avg_busbw: float | None
    """nccl-tests' own `# Avg bus bandwidth` line."""
    out_of_bounds_ok: bool | None
    """`# Out of bounds values : 0 OK` (None when the line is missing)."""

    @property
    def peak(self) -> BusRow | None:
        return max(self.rows, key=lambda r: r.busbw) if self.rows else None


def parse_all_reduce(text: str) -> NcclReport:
    """all_reduce_perf's table, read by its own header line (old and new column sets alike).

    The header is the `#` line naming `size`, `count` and `busbw` twice (out-of-place, then
    in-place); data lines start with the size in bytes. `#wrong` (nccl-tests 2.x) or `error`
    (older) follows each busbw; other lines (NCCL INFO, rank lists, MPI warnings) are skipped.
    """
    columns: list[str] = []
    rows: list[BusRow] = []
    avg: float | None = None
    bounds: bool | None = None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            words = stripped.lstrip("#").split()
            if "size" in words and "count" in words and words.count("busbw") == 2:
                columns = words
            if m := re.match(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)", stripped):
                avg = float(m[1])
            if m := re.match(r"#\s*Out of bounds values\s*:\s*(\d+)\s+(\w+)", stripped):
                bounds = m[1] == "0" and m[2] == "OK"
            continue
        words = stripped.split()
        if not columns or len(words) != len(columns) or not words[0].isdigit():
            continue
        busbw = [i for i, c in enumerate(columns) if c == "busbw"]
        wrong = [i + 1 for i in busbw]
        try:
            rows.append(BusRow(
                size=int(words[0]), dtype=words[columns.index("type")],
                busbw_out_of_place=float(words[busbw[0]]), busbw_in_place=float(words[busbw[1]]),
                wrong=sum(_wrong(words[i]) for i in wrong)))
        except (ValueError, IndexError):
            continue
    return NcclReport(rows, avg, bounds)


def _wrong(value: str) -> int:
    """A `#wrong` count, or an older `error` magnitude (any value above 1e-3 counts as one)."""
    if value.isdigit():
        return int(value)
    try:
        return int(float(value) > 1e-3)
    except ValueError:
        return 0  # N/A: run without checking (-c 0)


@dataclass(frozen=True)
class Expectation:
    """What the nodes' network should give all-reduce's bus bandwidth."""

    instance_type: str
    network_gbps: float
    up_to: bool
    nodes: int

    @property
    def busbw(self) -> float | None:
        """GB/s; None for one node (NVLink or PCIe only: the network is not measured)."""
        return self.network_gbps / 8 if self.nodes > 1 and self.network_gbps else None


def expectation(nodes: Sequence[Node]) -> Expectation:
    """The slowest network among the nodes (a group may mix types)."""
    types = [(t.network_gbps, t.network_up_to, t.name) for n in nodes if (t := catalog.get(n.instance_type))]
    if not types:
        return Expectation(nodes[0].instance_type if nodes else "?", 0.0, False, len(nodes))
    gbps, up_to, name = min(types)
    return Expectation(name, gbps, up_to, len(nodes))


def human_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


# --------------------------------------------------------------------------------- running


@dataclass
class NcclOutcome:
    """What each phase did, and the report when the benchmark ran."""

    phases: dict[str, list[NodeResult]] = field(default_factory=dict)
    report: NcclReport | None = None
    failed_phase: str | None = None
    revoked: bool = False

    @property
    def ran(self) -> NodeResult | None:
        results = self.phases.get("run")
        return results[0] if results else None


Runner = Callable[[JobPlan], JobResult]


def ssm_runner(ssm: Any, *, on_change: Callable[[NodeResult], None] | None = None) -> Runner:
    """Send a phase and wait for it (one SSM command per node, like `run`)."""
    def run(plan: JobPlan) -> JobResult:
        job = send_job(ssm, plan, comment="gpucluster nccl-test")
        if job.cancelled:
            return job
        return wait_job(ssm, job, timeout_seconds=plan.timeout_seconds + 60, on_change=on_change,
                        poll_seconds=5.0)
    return run


def plan_nccl_test(nodes: Sequence[Node], *, log_group: str,
                   group_environment: Mapping[str, str] | None = None,
                   max_bytes: str = DEFAULT_MAX_BYTES) -> JobPlan:
    """The ranks (as `run` gives them) the phases are cut from; the command is the test script."""
    if not MAX_BYTES.fullmatch(max_bytes):
        raise RunError(f"--nccl-max-bytes: a size like 512M or 4G, got {max_bytes!r}")
    env = {**dict(group_environment or {}), "GPUCLUSTER_NCCL_MAX_BYTES": max_bytes}
    return plan_job(nodes, NCCL_SCRIPT, timeout_seconds=RUN_TIMEOUT_SECONDS, group_environment=env,
                    log_group=log_group)


def phase_plan(base: JobPlan, phase: str, run_id: str, *, first_only: bool = False,
               extra: Mapping[str, str] | None = None) -> JobPlan:
    ranks = base.ranks[:1] if first_only else base.ranks
    timeout = RUN_TIMEOUT_SECONDS if phase == "run" else PHASE_TIMEOUT_SECONDS
    return JobPlan(base.command, [RankedNode(r.rank, r.node, {
        **r.environment, "GPUCLUSTER_NCCL_PHASE": phase, "GPUCLUSTER_NCCL_RUN": run_id, **dict(extra or {})})
        for r in ranks], timeout, base.log_group)


def run_nccl_test(base: JobPlan, run_id: str, runner: Runner,
                  on_phase: Callable[[str], None] | None = None) -> NcclOutcome:
    """key (rank 0) -> authorize (all) -> run (rank 0) -> revoke (all, always)."""
    outcome = NcclOutcome()

    def phase(name: str, **kwargs: Any) -> JobResult:
        if on_phase is not None:
            on_phase(name)
        job = runner(phase_plan(base, name, run_id, **kwargs))
        outcome.phases[name] = job.results
        if not job.ok and outcome.failed_phase is None:
            outcome.failed_phase = name
        return job

    try:
        key = phase("key", first_only=True)
        keys = [line for line in key.results[0].stdout.splitlines() if line.startswith("ssh-ed25519 ")]
        public = keys[0] if key.ok and keys else None
        if public is not None and phase("authorize", extra={"GPUCLUSTER_NCCL_PUBKEY": public}).ok:
            ran = phase("run", first_only=True)
            outcome.report = parse_all_reduce(ran.results[0].stdout)
        elif public is None and outcome.failed_phase is None:
            outcome.failed_phase = "key"
    finally:
        outcome.revoked = phase("revoke").ok
    return outcome


def assess(outcome: NcclOutcome, expected: Expectation) -> tuple[bool, list[str]]:
    """Pass or fail, and the lines saying why."""
    report = outcome.report
    lines: list[str] = []
    if not outcome.revoked:
        lines.append("the test's SSH key was not removed from every node (see above): remove the line "
                     "ending in gpucluster-nccl-test-<run> from /root/.ssh/authorized_keys")
    if outcome.failed_phase not in (None, "revoke"):
        return False, [f"the {outcome.failed_phase} phase failed", *lines]
    if report is None or not report.rows:
        return False, ["all_reduce_perf printed no result table", *lines]
    ok = outcome.revoked
    if report.out_of_bounds_ok is False or any(r.wrong for r in report.rows):
        ok = False
        lines.append("all_reduce_perf found wrong values: a GPU or the fabric corrupts data")
    peak = report.peak
    assert peak is not None
    want = expected.busbw
    if want is None:
        lines.append(f"peak bus bandwidth {peak.busbw:.1f} GB/s at {human_bytes(peak.size)} (one node: "
                     "NVLink/PCIe only, the network is not measured)")
        return ok, lines
    share = peak.busbw / want
    lines.append(f"peak bus bandwidth {peak.busbw:.1f} GB/s at {human_bytes(peak.size)}; "
                 f"{expected.instance_type}'s network gives {'up to ' if expected.up_to else ''}"
                 f"{want:.0f} GB/s ({expected.network_gbps:g} Gbps): {share:.0%}")
    if share < MIN_FRACTION:
        ok = False
        lines.append(f"below {MIN_FRACTION:.0%} of the network: is EFA in use (FI_PROVIDER=efa, "
                     "`fi_info -p efa`), and are the nodes in the group's placement group?")
    return ok, lines


# ------------------------------------------------------------------------- the flow


@dataclass
class NcclSetup:
    """The test on a stack's node group: the ranks the phases are cut from, what to expect."""

    base: JobPlan
    expected: Expectation

    @property
    def efa(self) -> bool:
        return self.base.ranks[0].environment.get("FI_PROVIDER") == "efa"

    @property
    def gpus_per_node(self) -> int:
        return int(self.base.ranks[0].environment["NPROC_PER_NODE"])

    def dry_run_phases(self) -> dict[str, list[str]]:
        """Phase -> the instances it would run on, in order."""
        return {phase: [r.node.instance_id for r in phase_plan(self.base, phase, "nccl-dry-run",
                                                                 first_only=first).ranks]
                for phase, first in (("key", True), ("authorize", False), ("run", True), ("revoke", False))}


def prepare_nccl_test(spec: StackSpec, group: str, *, clients: Clients, max_bytes: str = DEFAULT_MAX_BYTES,
                      progress: Spinner = no_spinner) -> NcclSetup:
    """Find the group's nodes and plan the test on them (RunError, NodesError: the request is wrong)."""
    found = find_nodes(spec, group, clients=clients, progress=progress)
    base = plan_nccl_test(found, log_group=run_log_group_name(spec.identity),
                          group_environment=group_environment(spec, group), max_bytes=max_bytes)
    return NcclSetup(base, expectation([r.node for r in base.ranks]))


@dataclass
class NcclResult:
    outcome: NcclOutcome
    passed: bool
    findings: list[str]
    """The lines saying why it passed or failed."""


def execute_nccl_test(setup: NcclSetup, run_id: str, ssm: Any, *,
                      on_phase: Callable[[str], None] | None = None,
                      progress: Spinner = no_spinner) -> NcclResult:
    """The phases through SSM (`progress` around each), then the verdict against the network."""
    send = ssm_runner(ssm)

    def phase(name: str) -> None:
        current["phase"] = name
        if on_phase is not None:
            on_phase(name)

    def runner(plan: JobPlan) -> JobResult:  # the run phase takes minutes
        with progress(f"nccl-test: {current['phase']} on {len(plan.ranks)} node(s)"):
            return send(plan)

    current = {"phase": ""}
    outcome = run_nccl_test(setup.base, run_id, runner, on_phase=phase)
    passed, findings = assess(outcome, setup.expected)
    return NcclResult(outcome, passed, findings)
