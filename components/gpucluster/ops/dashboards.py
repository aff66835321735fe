"""A stack's dashboards and rules for a Grafana and Prometheus of the team's own, and where its managed
Grafana is.

`export_dashboards` writes the stack's Grafana dashboards (one JSON file each, what Grafana's "Import
dashboard" and its HTTP API take) and its Prometheus rule file, rendered from the stack file by
`gpucluster.dashboards`; `push_dashboards` posts them to a Grafana's HTTP API (`POST
/api/dashboards/db`, Grafana docs "Dashboard HTTP API") with a service-account token; `grafana_url`
finds the stack's Amazon Managed Grafana workspace by its gpucluster:stack tag (ListWorkspaces returns
each workspace's tags and endpoint). Nothing here changes AWS.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpucluster.dashboards import from_spec, rendered, rules_document
from gpucluster.fleet.tags import STACK_TAG
from gpucluster.ops import OpsError
from gpucluster.spec import StackSpec

RULES_FILE = "gpucluster-rules.yml"
PUSH_TIMEOUT_SECONDS = 30


class DashboardsError(OpsError):
    """A Grafana that refused the dashboards, or could not be reached: one line for the operator."""


@dataclass(frozen=True)
class Export:
    directory: Path
    dashboards: tuple[Path, ...]
    rules: Path


def export_dashboards(spec: StackSpec, directory: Path) -> Export:
    """Write `<uid>.json` per dashboard and the rule file into `directory` (made if missing)."""
    settings = from_spec(spec)
    directory.mkdir(parents=True, exist_ok=True)
    files = []
    for uid, dashboard in rendered(settings).items():
        path = directory / f"{uid}.json"
        path.write_text(json.dumps(dashboard, indent=2, sort_keys=True) + "\n")
        files.append(path)
    rules = directory / RULES_FILE
    rules.write_text(yaml.safe_dump(rules_document(settings), sort_keys=False))
    return Export(directory, tuple(files), rules)


def push_dashboards(spec: StackSpec, grafana_url: str, token: str, *, folder_uid: str | None = None,
                    opener: Any = urllib.request.urlopen) -> list[str]:
    """Create or update every dashboard of the stack in a Grafana; returns their URLs there."""
    urls = []
    for uid, dashboard in rendered(from_spec(spec)).items():
        body: dict[str, Any] = {"dashboard": {**dashboard, "id": None}, "overwrite": True,
                                "message": f"gpucluster dashboards export {spec.stack}"}
        if folder_uid:
            body["folderUid"] = folder_uid
        request = urllib.request.Request(
            grafana_url.rstrip("/") + "/api/dashboards/db", data=json.dumps(body).encode(), method="POST",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with opener(request, timeout=PUSH_TIMEOUT_SECONDS) as response:
                answer = json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:200]
            raise DashboardsError(f"Grafana refused dashboard {uid}: HTTP {err.code} {detail}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise DashboardsError(f"cannot reach Grafana at {grafana_url}: {err}") from None
        urls.append(grafana_url.rstrip("/") + str(answer.get("url", f"/d/{uid}")))
    return urls


def grafana_url(spec: StackSpec, client: Any) -> str | None:
    """The stack's Amazon Managed Grafana workspace URL (by its gpucluster:stack tag), None if none."""
    for page in client.get_paginator("list_workspaces").paginate():
        for workspace in page.get("workspaces", []):
            if workspace.get("tags", {}).get(STACK_TAG) == spec.identity and workspace.get("endpoint"):
                return f"https://{workspace['endpoint']}"
    return None
