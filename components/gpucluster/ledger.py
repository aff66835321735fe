"""The ledger: facts the code relies on that no test here can observe, and which of them a stack needs.

Mocks and moto accept any input, so a fact about AWS (a port PCS opens, a permission a service checks
on the caller's behalf, a price) is only as good as its source. `catalog/data/ledger.yaml` lists each
one with its source and status (documented, measured, unverified), the stacks that rely on it (`when`,
terms of `CONDITIONS`) and how `gpucluster verify` checks it in an account. The code cites an entry
as `ledger: <id>` where it relies on it (tests/test_ledger.py keeps both sides in step); `plan` names
the unverified entries of the planned stack; docs/reference/ledger.md is rendered from the file.
Pure: no Pulumi, no AWS call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, get_args

from gpucluster.catalog import carried, read_data_file
from gpucluster.spec import StackSpec, baked_image, can_run_spot

LEDGER_FILE = Path(__file__).parent / "catalog" / "data" / "ledger.yaml"
Status = Literal["documented", "measured", "unverified"]
STATUSES: tuple[Status, ...] = get_args(Status)
PAGE = "docs/reference/ledger.md"

CONDITIONS: dict[str, Callable[[StackSpec], bool]] = {
    "always": lambda spec: True,
    "slurm": lambda spec: spec.scheduler.slurm,
    "slurm_accounting": lambda spec: spec.scheduler.slurm and spec.scheduler.accounting,
    "eks": lambda spec: spec.scheduler.eks,
    "baked": lambda spec: any(baked_image(spec.images, g) for g in spec.node_groups),
    "prometheus": lambda spec: spec.observability.prometheus.active,
    "grafana": lambda spec: spec.observability.grafana.enabled,
    "mig": lambda spec: any(g.mig is not None for g in spec.node_groups),
    "spot": lambda spec: any(can_run_spot(g) for g in spec.node_groups),
    "capacity_block": lambda spec: any(g.capacity.market == "capacity_block" for g in spec.node_groups),
    "warm_pool": lambda spec: any(g.warm_pool is not None for g in spec.node_groups),
    "no_nat": lambda spec: not spec.network.nat_gateway,
    "fsx_existing_bucket": lambda spec: any(d.existing and d.fsx is not None for d in spec.datasets),
    # The stopping guardrails (budget action, autostop, Capacity Block) keep their state in a DynamoDB table.
    "guard_state": lambda spec: ((spec.budget is not None
                                  and spec.budget.action_threshold_percent is not None)
                                 or spec.autostop.enabled
                                 or any(g.capacity.market == "capacity_block" for g in spec.node_groups)),
    # A region the catalog carries no prices for: priced from the AWS Price List (the project's price file,
    # the spend guard at run time).
    "price_list": lambda spec: spec.region not in carried(),
    # The spend guard (a budget with an action threshold) reads Cost Explorer on a schedule.
    "spend_guard": lambda spec: spec.budget is not None and spec.budget.action_threshold_percent is not None,
    # Idle auto-stop (its alarm is read again before a stop).
    "autostop": lambda spec: spec.autostop.enabled,
    # A fact a command relies on (verify, the operator policy), not a stack: on the page, never in `plan`.
    "cli": lambda spec: False,
}
"""The `when` vocabulary: each term is a question the stack's spec answers."""


@dataclass(frozen=True)
class Entry:
    """One fact: what it says, where it comes from, how sure we are, who relies on it, how to check it."""

    id: str
    says: str
    source: str
    status: Status
    when: tuple[str, ...]
    verify: str | None
    """How `gpucluster verify` checks it in an account; None where read-only calls cannot show it."""
    recheck: str | None = None
    """How a person re-checks it, where `verify` cannot (or beyond what it can)."""
    note: str | None = None

    def applies(self, spec: StackSpec) -> bool:
        """Whether `spec`'s stack relies on this fact (every `when` term holds)."""
        return all(CONDITIONS[term](spec) for term in self.when)

    def as_json(self) -> dict[str, object]:
        return {"id": self.id, "says": self.says, "source": self.source, "verify": self.verify}


class LedgerError(ValueError):
    """The ledger file is malformed (a test and the loader say which entry and why)."""


def _entry(raw: dict[str, object]) -> Entry:
    where = f"ledger entry {raw.get('id')!r}"
    unknown = set(raw) - {"id", "says", "source", "status", "when", "verify", "recheck", "note"}
    if unknown:
        raise LedgerError(f"{where}: unknown keys {sorted(unknown)}")
    if raw.get("status") not in STATUSES:
        raise LedgerError(f"{where}: status must be one of {', '.join(STATUSES)}, got {raw.get('status')!r}")
    when = raw.get("when")
    if not isinstance(when, list) or not when or any(term not in CONDITIONS for term in when):
        raise LedgerError(f"{where}: when must be a non-empty list of {', '.join(CONDITIONS)}, got {when!r}")
    return Entry(id=str(raw["id"]), says=str(raw["says"]), source=str(raw["source"]),
                 status=cast(Status, raw["status"]), when=tuple(when),
                 verify=cast("str | None", raw.get("verify")), recheck=cast("str | None", raw.get("recheck")),
                 note=cast("str | None", raw.get("note")))


def load_ledger(path: Path = LEDGER_FILE) -> tuple[Entry, ...]:
    """Every entry of the ledger file, in its order."""
    entries = tuple(_entry(raw) for raw in read_data_file(path)["entries"])
    ids = [e.id for e in entries]
    if len(ids) != len(set(ids)):
        raise LedgerError(f"ledger: duplicate ids {sorted({i for i in ids if ids.count(i) > 1})}")
    return entries


def unverified_facts(spec: StackSpec, entries: Iterable[Entry] | None = None) -> list[Entry]:
    """The unverified entries `spec`'s stack relies on, in the ledger's order."""
    return [e for e in (load_ledger() if entries is None else entries)
            if e.status == "unverified" and e.applies(spec)]


def plan_line(facts: list[Entry]) -> str:
    """`plan`'s one line naming the unverified facts a stack relies on (`unverified_facts`)."""
    checked = sum(1 for f in facts if f.verify)
    return (f"unverified: {len(facts)} fact{'s' if len(facts) != 1 else ''} this stack relies on "
            f"({', '.join(f.id for f in facts)}): gpucluster verify checks {checked} of them after "
            f"pulumi up; see {PAGE}")
