"""A small Kubernetes API server on a local port, answering as the API does for what the EKS job backend
asks: JobSets (create, list by label, get, delete), Kueue Workloads (list), pods (list by label) and a
pod's log; errors as the API's `Status` objects. Each request is recorded (method, path, query, body and
the Authorization header) so a test can see what was sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2"
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta1/workloads"


@dataclass
class FakeKube:
    """The server's state: objects by kind, and what to fail."""

    jobsets: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)
    fail: dict[tuple[str, str], tuple[int, str]] = field(default_factory=dict)
    """(method, path prefix) -> (status, message): answered instead."""
    lists: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Any other list path (`/api/v1/nodes`, `/apis/apps/v1/deployments`) -> its items (label-selected)."""
    keep_on_delete: str | None = None
    """None: a delete removes the JobSet; "mark": it stays with a deletionTimestamp; "ignore": unchanged."""
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""


def status(code: int, message: str) -> dict[str, Any]:
    reason = {
        400: "BadRequest",
        401: "Unauthorized",
        403: "Forbidden",
        404: "NotFound",
        409: "AlreadyExists",
        500: "InternalError",
    }.get(code, "Unknown")
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def selected(obj: dict[str, Any], selector: str) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in (term.split("=", 1) for term in selector.split(",") if term))


def handler(state: FakeKube) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:
            pass

        def send(self, code: int, body: Any, content_type: str = "application/json") -> None:
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def handle_any(self, method: str) -> None:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            state.requests.append(
                {
                    "method": method,
                    "path": url.path,
                    "query": query,
                    "body": body,
                    "authorization": self.headers.get("Authorization"),
                }
            )
            for (m, prefix), (code, message) in state.fail.items():
                if m == method and url.path.startswith(prefix):
                    self.send(code, status(code, message))
                    return
            parts = url.path.strip("/").split("/")
            if url.path == f"{JOBSETS}/jobsets" and method == "GET":
                items = [o for o in state.jobsets.values() if selected(o, query.get("labelSelector", ""))]
                self.send(
                    200, {"kind": "JobSetList", "apiVersion": "jobset.x-k8s.io/v1alpha2", "items": items}
                )
            elif url.path.startswith(f"{JOBSETS}/namespaces/"):
                self.jobset(method, parts[4], parts[6] if len(parts) > 6 else None, body)
            elif url.path in state.lists and method == "GET":
                items = [o for o in state.lists[url.path] if selected(o, query.get("labelSelector", ""))]
                self.send(200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items})
            elif url.path == WORKLOADS and method == "GET":
                self.send(
                    200,
                    {
                        "kind": "WorkloadList",
                        "apiVersion": "kueue.x-k8s.io/v1beta1",
                        "items": state.workloads,
                    },
                )
            elif len(parts) == 5 and parts[:2] == ["api", "v1"] and parts[4] == "pods" and method == "GET":
                items = [
                    p
                    for p in state.pods
                    if p["metadata"]["namespace"] == parts[3] and selected(p, query.get("labelSelector", ""))
                ]
                self.send(200, {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items})
            elif len(parts) == 7 and parts[4] == "pods" and parts[6] == "log" and method == "GET":
                if parts[5] not in state.logs:
                    self.send(404, status(404, f'pods "{parts[5]}" not found'))
                    return
                text = state.logs[parts[5]]
                if "tailLines" in query:
                    text = "".join(text.splitlines(keepends=True)[-int(query["tailLines"]) :])
                self.send(200, text, "text/plain")
            else:
                self.send(404, status(404, f"the server could not find the requested resource ({url.path})"))

        def jobset(self, method: str, namespace: str, name: str | None, body: Any) -> None:
            if method == "POST" and name is None:
                key = (namespace, body["metadata"]["name"])
                if key in state.jobsets:
                    self.send(409, status(409, f'jobsets.jobset.x-k8s.io "{key[1]}" already exists'))
                    return
                created = {
                    **body,
                    "metadata": {
                        **body["metadata"],
                        "creationTimestamp": "2026-11-29T07:00:00Z",
                        "uid": f"uid-{key[1]}",
                    },
                    "spec": {**body["spec"], "suspend": True},
                }  # Kueue suspends it until admitted
                state.jobsets[key] = created
                self.send(201, created)
                return
            key = (namespace, name or "")
            if key not in state.jobsets:
                self.send(404, status(404, f'jobsets.jobset.x-k8s.io "{name}" not found'))
            elif method == "GET":
                self.send(200, state.jobsets[key])
            elif method == "DELETE":
                found = state.jobsets[key]
                if state.keep_on_delete is None:
                    del state.jobsets[key]
                elif state.keep_on_delete == "mark":
                    found["metadata"]["deletionTimestamp"] = "2026-11-29T07:05:00Z"
                self.send(200, found)
            else:
                self.send(405, status(400, "method not allowed"))

        def do_GET(self) -> None:
            self.handle_any("GET")

        def do_POST(self) -> None:
            self.handle_any("POST")

        def do_DELETE(self) -> None:
            self.handle_any("DELETE")

    return Handler


@contextmanager
def fake_kube() -> Iterator[FakeKube]:
    """The server on 127.0.0.1 at a port the OS picks, for the block."""
    state = FakeKube()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
