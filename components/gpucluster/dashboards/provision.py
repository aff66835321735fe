"""Provisioning a Grafana over its HTTP API: the stack's Prometheus data source and its dashboards.

What `pulumi up` does into the stack's Amazon Managed Grafana workspace (through the dynamic resource
of `gpucluster.aws.grafana_dashboards`), with a service-account token: create or update the data
source that queries the stack's AMP workspace with SigV4 as the workspace's role, then create or
overwrite every dashboard of `gpucluster.dashboards.rendered`, each pointing at that data source.
Grafana docs, "Data source HTTP API" (GET /api/datasources/uid/:uid, POST /api/datasources,
PUT /api/datasources/uid/:uid) and "Dashboard HTTP API" (POST /api/dashboards/db with overwrite). A
Grafana that throttles or fails (429, 5xx, no answer) is asked again, a bounded number of times with a
doubling wait; what it refuses (401, 403, 400...) is one line naming the call. No Pulumi, no AWS call.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

DATASOURCE_UID = "gpucluster-amp"
TIMEOUT_SECONDS = 30
ATTEMPTS = 5
FIRST_WAIT_SECONDS = 2.0
RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})


class ProvisionError(RuntimeError):
    """Grafana refused, or never answered: one line for the operator (`status`: the HTTP status of a
    refusal, None when Grafana never answered)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def amp_query_url(remote_write_url: str) -> str:
    """The workspace's query endpoint, what a Grafana data source takes (AMP user guide, "Set up
    Grafana": https://aps-workspaces.<region>.amazonaws.com/workspaces/<id>), from its remote-write URL."""
    suffix = "/api/v1/remote_write"
    if not remote_write_url.endswith(suffix):
        raise ValueError(f"not an AMP remote-write URL: {remote_write_url!r}")
    return remote_write_url[: -len(suffix)]


def amp_datasource(name: str, query_url: str, region: str) -> dict[str, Any]:
    """A Prometheus data source signing with SigV4 as the workspace's own IAM role.

    From the AMG user guide's data-source provisioning examples (ledger: amg-datasource-sigv4): the
    workspace role is Grafana's default AWS credentials, `sigV4AuthType: ec2_iam_role`.
    """
    return {"uid": DATASOURCE_UID, "name": name, "type": "prometheus", "access": "proxy", "url": query_url,
            "isDefault": True, "jsonData": {"httpMethod": "POST", "sigV4Auth": True,
                                            "sigV4AuthType": "ec2_iam_role", "sigV4Region": region}}


def on_datasource(dashboard: Mapping[str, Any], uid: str = DATASOURCE_UID) -> dict[str, Any]:
    """`dashboard` with its `datasource` variable set to the provisioned data source."""
    copy = json.loads(json.dumps(dashboard))
    for variable in copy.get("templating", {}).get("list", []):
        if variable.get("name") == "datasource":
            variable["current"] = {"text": uid, "value": uid}
    return copy


Opener = Callable[..., Any]


@dataclass
class Grafana:
    """A Grafana HTTP API reached with a bearer token (a service-account token)."""

    url: str
    token: str
    opener: Opener = urllib.request.urlopen
    sleep: Callable[[float], None] = time.sleep
    attempts: int = ATTEMPTS
    calls: list[str] = field(default_factory=list)

    def call(self, method: str, path: str, body: Any = None, *, missing_ok: bool = False) -> Any:
        """The JSON answer of one call (None for a 404 when `missing_ok`), retried while Grafana fails."""
        where = f"{method} {path}"
        wait = FIRST_WAIT_SECONDS
        for attempt in range(1, self.attempts + 1):
            self.calls.append(where)
            request = urllib.request.Request(
                self.url.rstrip("/") + path, method=method,
                data=None if body is None else json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                         "Accept": "application/json"})
            try:
                with self.opener(request, timeout=TIMEOUT_SECONDS) as response:
                    return json.loads(response.read() or b"null")
            except urllib.error.HTTPError as err:
                if err.code == 404 and missing_ok:
                    return None
                detail = err.read().decode(errors="replace")[:200]
                if err.code not in RETRIED_STATUSES:
                    hint = " (the dashboards' service-account token expired or was revoked?)" \
                        if err.code == 401 else ""
                    raise ProvisionError(f"Grafana at {self.url} refused {where}: HTTP {err.code} "
                                         f"{detail}{hint}", err.code) from None
                last = f"HTTP {err.code} {detail}"
            except (urllib.error.URLError, TimeoutError, OSError) as err:
                last = str(err)
            if attempt < self.attempts:
                self.sleep(wait)
                wait *= 2
        raise ProvisionError(f"Grafana at {self.url} did not answer {where} after {self.attempts} "
                             f"attempts (last: {last})")


def provision(grafana: Grafana, datasource: Mapping[str, Any],
              dashboards: Mapping[str, Mapping[str, Any]], message: str) -> list[str]:
    """Create or update the data source, then every dashboard on it; their URLs in Grafana.

    Idempotent: a second run updates the same data source (by uid) and overwrites the same dashboards
    (by uid), so a retry after a failure half-way is one run.
    """
    uid = datasource["uid"]
    if grafana.call("GET", f"/api/datasources/uid/{uid}", missing_ok=True) is None:
        grafana.call("POST", "/api/datasources", dict(datasource))
    else:
        grafana.call("PUT", f"/api/datasources/uid/{uid}", dict(datasource))
    urls = []
    for dashboard_uid, dashboard in sorted(dashboards.items()):
        body = {"dashboard": {**on_datasource(dashboard, uid), "id": None}, "overwrite": True,
                "message": message}
        answer = grafana.call("POST", "/api/dashboards/db", body)
        path = (answer or {}).get("url") or f"/d/{dashboard_uid}"
        urls.append(grafana.url.rstrip("/") + str(path))
    return urls
