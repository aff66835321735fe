"""`gpucluster dashboards export`, the Grafana URL `status` prints, and the metrics column of `nodes`:
the ops functions against a local HTTP server (a Grafana, an AMP query API) and botocore Stubbers."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.credentials import Credentials
from botocore.stub import Stubber
from typer.testing import CliRunner

from base_config import base
from gpucluster.cli.entry import app
from gpucluster.fleet.tags import STACK_TAG
from gpucluster.ops.dashboards import DashboardsError, export_dashboards, grafana_url, push_dashboards
from gpucluster.ops.metrics import metrics_status, writers_query
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import StackSpec

DIGEST = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04@sha256:" + "ab" * 32
WS = "ws-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"
runner = CliRunner()


def spec_of(section: dict[str, Any] | None = None) -> StackSpec:
    config = base()
    if section is not None:
        config["gpucluster:observability"] = section
    return parse_stack_config(config, stack="t")


class Recorder(http.server.BaseHTTPRequestHandler):
    """Answers every POST with the server's `answer` (status, body) and records the requests."""

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.requests.append((self.path, dict(self.headers), body))  # type: ignore[attr-defined]
        status, answer = self.server.answer(self.path, body)  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(answer).encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Any]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    httpd.requests = []  # type: ignore[attr-defined]
    httpd.answer = lambda path, body: (200, {})  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    httpd.url = f"http://127.0.0.1:{httpd.server_address[1]}"  # type: ignore[attr-defined]
    yield httpd
    httpd.shutdown()


def test_export_writes_every_dashboard_and_the_rule_file(tmp_path: Path) -> None:
    spec = spec_of()
    done = export_dashboards(spec, tmp_path / "out")
    names = sorted(p.name for p in done.dashboards)
    assert names == ["gpucluster-mig.json", "gpucluster-node-group.json", "gpucluster-node.json",
                     "gpucluster-overview.json"]
    overview = json.loads((tmp_path / "out" / "gpucluster-overview.json").read_text())
    assert overview["uid"] == "gpucluster-overview" and overview["panels"]
    assert all(spec.identity in t["expr"] for p in overview["panels"] for t in p["targets"])
    rules = yaml.safe_load(done.rules.read_text())
    idle = next(r for r in rules["groups"][0]["rules"] if r["record"] == "gpucluster:node_group:idle")
    threshold = f"{spec.autostop.gpu_utilization_threshold_percent:g}"
    window_max = "gpucluster:node_group:gpu_util_max_over_idle_window"
    assert idle["expr"].startswith(f"({window_max} < bool {threshold})")


def test_export_uses_the_stacks_autostop_window_and_threshold() -> None:
    config = base()
    config["gpucluster:autostop"] = {"idle_minutes": 45, "gpu_utilization_threshold_percent": 12.5}
    spec = parse_stack_config(config, stack="t")
    from gpucluster.dashboards import from_spec, rules_document
    rules = {r.get("record"): r["expr"] for r in rules_document(from_spec(spec))["groups"][0]["rules"]}
    assert "[45m]" in rules["gpucluster:node_group:gpu_util_max_over_idle_window"]
    assert rules["gpucluster:node_group:idle"] == (
        "(gpucluster:node_group:gpu_util_max_over_idle_window < bool 12.5)\n"
        f'* (count_over_time(gpucluster:node_group:gpu_util_max{{gpucluster_stack="{spec.identity}"}}[45m]) '
        ">= bool 41)")  # 90 % of the window's 45 evaluations, rounded up


def test_push_creates_or_updates_each_dashboard_with_the_token(server: Any) -> None:
    server.answer = lambda path, body: (200, {"url": f"/d/{json.loads(body)['dashboard']['uid']}/x"})
    urls = push_dashboards(spec_of(), server.url, "glsa_token", folder_uid="gpus")
    assert urls == [f"{server.url}/d/{uid}/x" for uid in ("gpucluster-overview", "gpucluster-node-group",
                                                          "gpucluster-node", "gpucluster-mig")]
    for path, headers, body in server.requests:
        sent = json.loads(body)
        assert path == "/api/dashboards/db" and headers["Authorization"] == "Bearer glsa_token"
        assert sent["overwrite"] is True and sent["folderUid"] == "gpus" and sent["dashboard"]["id"] is None


def test_push_reports_a_refusal_in_one_line(server: Any) -> None:
    server.answer = lambda path, body: (401, {"message": "invalid API key"})
    with pytest.raises(DashboardsError, match=r"HTTP 401.*invalid API key"):
        push_dashboards(spec_of(), server.url, "bad")


def test_push_reports_an_unreachable_grafana() -> None:
    with pytest.raises(DashboardsError, match="cannot reach Grafana"):
        push_dashboards(spec_of(), "http://127.0.0.1:9", "t")


def test_cli_export_writes_files_and_refuses_a_push_without_token(tmp_path: Path, write_stack: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    stack = write_stack(base(), "dev")
    result = runner.invoke(app, ["dashboards", "export", str(stack), "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output
    assert "wrote 4 dashboards and gpucluster-rules.yml" in result.output
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    result = runner.invoke(app, ["dashboards", "export", str(stack), "--grafana-url", "https://g.example"])
    assert result.exit_code == 2 and "GRAFANA_TOKEN" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["dashboards", "export", str(stack), "--grafana-url", "g.example"])
    assert result.exit_code == 2 and "--grafana-url: must be an http(s) URL" in result.output


def test_cli_export_pushes_into_a_grafana(tmp_path: Path, write_stack: Any, server: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAFANA_TOKEN", "glsa_x")
    stack = write_stack(base(), "dev")
    result = runner.invoke(app, ["dashboards", "export", str(stack), "--out", str(tmp_path / "d"),
                                 "--grafana-url", server.url, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert len(document["grafana"]) == 4 and len(server.requests) == 4


def grafana_client(workspaces: list[dict[str, Any]]) -> Any:
    client = boto3.client("grafana", region_name="us-east-1", aws_access_key_id="x",
                          aws_secret_access_key="x")
    stub = Stubber(client)
    stub.add_response("list_workspaces", {"workspaces": workspaces})
    stub.activate()
    return client


def workspace(endpoint: str, tags: dict[str, str]) -> dict[str, Any]:
    return {"authentication": {"providers": ["AWS_SSO"]}, "created": 0, "endpoint": endpoint,
            "grafanaVersion": "10.4",
            "id": "g-abc1234567", "modified": 0, "status": "ACTIVE", "tags": tags}


def test_grafana_url_is_the_workspace_tagged_with_the_stack() -> None:
    spec = spec_of()
    client = grafana_client([workspace("g-other.grafana-workspace.us-east-1.amazonaws.com", {STACK_TAG: "x"}),
                             workspace("g-abc.grafana-workspace.us-east-1.amazonaws.com",
                                       {STACK_TAG: spec.identity})])
    assert grafana_url(spec, client) == "https://g-abc.grafana-workspace.us-east-1.amazonaws.com"
    assert grafana_url(spec, grafana_client([])) is None


# ------------------------------------------------------------------- nodes: who writes


ON = {"prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST}}
CREDENTIALS = Credentials("AKIDEXAMPLE", "secret")


def amp_client(workspaces: list[dict[str, Any]], *, error: str | None = None) -> Any:
    client = boto3.client("amp", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    stub = Stubber(client)
    if error:
        stub.add_client_error("list_workspaces", error)
    else:
        stub.add_response("list_workspaces", {"workspaces": workspaces})
    stub.activate()
    return client


def active(workspace_id: str) -> dict[str, Any]:
    return {"workspaceId": workspace_id,
            "arn": f"arn:aws:aps:us-east-1:123456789012:workspace/{workspace_id}",
            "createdAt": 0, "status": {"statusCode": "ACTIVE"}, "alias": "a"}


def via(server: Any) -> Any:
    """An opener that sends the signed request to the local server instead of AMP's endpoint."""
    import urllib.request

    def opener(request: urllib.request.Request, timeout: float) -> Any:
        server.signed_for = request.full_url
        local = urllib.request.Request(server.url + "/api/v1/query", data=request.data, method="POST",
                                       headers=dict(request.header_items()))
        return urllib.request.urlopen(local, timeout=timeout)

    return opener


def vector(result: list[dict[str, Any]]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


def test_nodes_writing_exporter_down_and_silent(server: Any) -> None:
    spec = spec_of(ON)
    server.answer = lambda path, body: (200, vector([
        {"metric": {"instance_id": "i-1"}, "value": [0, "1"]},
        {"metric": {"instance_id": "i-2"}, "value": [0, "0"]}]))
    status = metrics_status(spec, ["i-1", "i-2", "i-3"], amp=amp_client([active(WS)]),
                            credentials=CREDENTIALS, opener=via(server))
    assert status == {"i-1": "writing", "i-2": "exporter down", "i-3": "not writing"}
    assert server.signed_for == f"https://aps-workspaces.us-east-1.amazonaws.com/workspaces/{WS}/api/v1/query"
    [(_, headers, body)] = server.requests
    assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/us-east-1/aps/aws4_request" in headers["Authorization"]
    assert body.decode() == urllib.parse.urlencode({"query": writers_query(spec.identity)})


def test_an_existing_workspace_is_queried_in_its_own_region(server: Any) -> None:
    url = f"https://aps-workspaces.us-west-2.amazonaws.com/workspaces/{WS}/api/v1/remote_write"
    spec = spec_of({"prometheus": {"remote_write_url": url, "region": "us-west-2",
                                   "dcgm_exporter_image": DIGEST}})
    server.answer = lambda path, body: (200, vector([]))
    status = metrics_status(spec, ["i-1"], amp=None, credentials=CREDENTIALS, opener=via(server))
    assert status == {"i-1": "not writing"}
    assert server.signed_for == url.replace("remote_write", "query")
    assert "/us-west-2/aps/aws4_request" in server.requests[0][1]["Authorization"]


@pytest.mark.parametrize("case", ["access denied", "no workspace", "refused", "no credentials"])
def test_a_workspace_that_cannot_be_asked_makes_every_node_unknown(server: Any, case: str) -> None:
    spec = spec_of(ON)
    amp = amp_client([], error="AccessDeniedException") if case == "access denied" else amp_client(
        [] if case == "no workspace" else [active(WS)])
    server.answer = lambda path, body: (403, {"message": "denied"})
    status = metrics_status(spec, ["i-1", "i-2"], amp=amp, opener=via(server),
                            credentials=None if case == "no credentials" else CREDENTIALS)
    assert status == {"i-1": "unknown", "i-2": "unknown"}


def test_status_overview_finds_the_grafana_workspace_only_when_the_stack_has_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gpucluster.ops.doctor as doctor
    import gpucluster.ops.nodegroups as nodegroups
    import gpucluster.ops.status as status
    from gpucluster.ops.overview import stack_overview

    monkeypatch.setattr(nodegroups, "stack_fleet", lambda *a, **k: None)
    monkeypatch.setattr(status, "stack_status", lambda *a, **k: [])
    import gpucluster.ops.stopstart as stopstart
    monkeypatch.setattr(stopstart, "start_maxima", lambda *a, **k: [])  # the fleet read is stubbed out
    monkeypatch.setattr(doctor, "cost_tag_warning", lambda *a, **k: None)
    import gpucluster.ops.boottimes as boottimes
    monkeypatch.setattr(boottimes, "stack_boot_times", lambda *a, **k: ([], None))
    spec = spec_of({**ON, "grafana": {"enabled": True, "authentication_providers": ["AWS_SSO"]}})
    asked: list[str] = []

    def clients(service: str) -> Any:
        asked.append(service)
        return grafana_client([workspace("g-1.grafana-workspace.us-east-1.amazonaws.com",
                                         {STACK_TAG: spec.identity})])

    overview = stack_overview(spec, clients=clients, ce=None)
    assert overview.grafana_url == "https://g-1.grafana-workspace.us-east-1.amazonaws.com"
    asked.clear()
    assert stack_overview(spec_of(ON), clients=clients, ce=None).grafana_url is None
    assert "grafana" not in asked


def test_nodes_shows_the_metrics_column_only_with_prometheus_on() -> None:
    from gpucluster.cli.fleet import render_nodes
    from gpucluster.ops.nodes import Node

    node = Node(instance_id="i-0abc", node_group="train", asg="a", instance_type="p5.48xlarge",
                zone="us-east-1a", private_ip="10.0.0.1", lifecycle="on-demand", state="running",
                asg_state="InService", health="Healthy", launch_time=None, ssm="Online")
    assert "metrics" not in " ".join(render_nodes([node]))
    assert "metrics" not in node.as_json()
    silent = replace(node, metrics="not writing")
    table = " ".join(" ".join(render_nodes([silent])).split())  # folded columns wrap: one line
    assert "metrics: not writing" in table
    assert silent.as_json()["metrics"] == "not writing"
