"""Conformance findings known on today's code, until the "Slurm for real" fix of aws/pcs.py merges.

pulumi-aws-native's SDK types the PCS Cluster's SlurmConfiguration as the Queue's (only
`slurmCustomSettings`), so `pulumi preview` refuses the two keys aws/pcs.py gives the cluster. Once the
cluster is created through a resource that carries them, empty KNOWN_UNTIL_PCS_FIX: every test that
reads it then requires no finding at all, and every Slurm plan exits 0.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpucluster.policy.records import Violation

KNOWN_UNTIL_PCS_FIX: frozenset[tuple[str, str]] = frozenset({
    ("aws-native:pcs:Cluster", "slurmConfiguration.accounting"),
    ("aws-native:pcs:Cluster", "slurmConfiguration.scaleDownIdleTimeInSeconds"),
})
"""(resource type, property path) of each finding the PCS fix removes."""

SLURM_PLAN_EXIT = 1 if KNOWN_UNTIL_PCS_FIX else 0
"""`gpucluster plan`'s exit code on a Slurm stack that breaks no policy."""


def known(resource_type: str | None, message: str) -> bool:
    """A provider-conformance finding on the known list (its message starts with its path)."""
    return any(resource_type == t and message.startswith(f"{path}: ") for t, path in KNOWN_UNTIL_PCS_FIX)


def unexpected(violations: Iterable[Violation]) -> list[str]:
    """Every violation except the known conformance findings, as text."""
    return [str(v) for v in violations
            if not (v.policy == "provider-conformance" and known(v.resource_type, v.message))]


def slurm_verdict() -> str:
    """The verdict line of a Slurm stack's plan that breaks no policy but the known findings."""
    n = len(KNOWN_UNTIL_PCS_FIX)
    return f"policies: {n} violation(s), {n} mandatory" if n else "policies: no violations"
