"""The small pinned JSON schemas of the custom resources gpucluster emits or submits (Kueue's
ResourceFlavor, ClusterQueue, LocalQueue and manager Configuration, JobSet), package data in
`eks/schemas/`, one per `<group>-<version>-<Kind>.json`.

No API server runs where gpucluster plans, and Kueue's and JobSet's CRDs are not in
kubernetes-validate's schemas: these hold the fields gpucluster sets, each schema naming its source
(`description`) and its ledger entry. They were written from the CRDs' Go types, not copied from
the CRD files (from memory; ledger: eks-crd-schemas). Unknown fields are refused.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

SCHEMAS = Path(__file__).resolve().parent / "schemas"


def schema_file(api_version: str, kind: str) -> Path:
    return SCHEMAS / f"{api_version.replace('/', '-')}-{kind}.json"


@functools.cache
def schema(api_version: str, kind: str) -> dict[str, Any] | None:
    """The pinned schema of `api_version`/`kind`, read once per process (None: none ships)."""
    path = schema_file(api_version, kind)
    return json.loads(path.read_text()) if path.is_file() else None


def pinned_kinds() -> list[tuple[str, str]]:
    """(apiVersion, kind) of every shipped schema."""
    found = []
    for path in sorted(SCHEMAS.glob("*.json")):
        doc = json.loads(path.read_text())
        props = doc["properties"]
        found.append((props["apiVersion"]["const"], props["kind"]["const"]))
    return found
