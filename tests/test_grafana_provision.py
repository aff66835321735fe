"""Dashboards provisioned into the stack's Amazon Managed Grafana by `pulumi up`.

The HTTP side runs against a small Grafana of our own (a real HTTP server in the test, answering the
data source and dashboard API calls Grafana answers, and failing on demand: 503s, 401s, silence).
The Pulumi side (service account, token, the dynamic resource) under the mock engine.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpucluster.aws.grafana_dashboards import TOKEN_SECONDS, DashboardsProvider, provisioned_digest
from gpucluster.dashboards import from_spec, rendered
from gpucluster.dashboards.provision import (
    DATASOURCE_UID,
    Grafana,
    ProvisionError,
    amp_datasource,
    amp_query_url,
    provision,
)
from test_prometheus_stack import planned

TOKEN = "glsa_test_token"
URL = "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1234/api/v1/remote_write"


class FakeGrafana:
    """Data sources and dashboards by uid; `fail` holds statuses to answer before serving normally."""

    def __init__(self) -> None:
        self.datasources: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.calls: list[str] = []
        self.fail: list[int] = []
        self.tokens: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def handle_any(self) -> None:
                fake.calls.append(f"{self.command} {self.path}")
                fake.tokens.append(self.headers.get("Authorization", ""))
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                if fake.fail:
                    status = fake.fail.pop(0)
                    return self.answer(status, {"message": f"status {status}"})
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self.answer(401, {"message": "invalid API key"})
                if self.command == "GET" and self.path.startswith("/api/datasources/uid/"):
                    found = fake.datasources.get(self.path.rsplit("/", 1)[1])
                    return self.answer(200, found) if found else self.answer(404, {"message": "not found"})
                if self.command == "POST" and self.path == "/api/datasources":
                    fake.datasources[body["uid"]] = body
                    return self.answer(200, {"message": "Datasource added"})
                if self.command == "PUT" and self.path.startswith("/api/datasources/uid/"):
                    fake.datasources[self.path.rsplit("/", 1)[1]] = body
                    return self.answer(200, {"message": "Datasource updated"})
                if self.command == "POST" and self.path == "/api/dashboards/db":
                    uid = body["dashboard"]["uid"]
                    fake.dashboards[uid] = body
                    return self.answer(200, {"status": "success", "uid": uid, "url": f"/d/{uid}/x"})
                return self.answer(404, {"message": "no such API"})

            do_GET = do_POST = do_PUT = handle_any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    fake = FakeGrafana()
    yield fake
    fake.server.shutdown()


def client(fake: FakeGrafana, **kwargs: Any) -> tuple[Grafana, list[float]]:
    waits: list[float] = []
    return Grafana(fake.url, kwargs.pop("token", TOKEN), sleep=waits.append, **kwargs), waits


DATASOURCE = amp_datasource("gpucluster o/p/prod/gpu-prod", amp_query_url(URL), "us-east-1")


def dashboards() -> dict[str, Any]:
    return rendered(from_spec(planned("own").spec))


def test_the_data_source_and_every_dashboard_land_on_a_fresh_grafana(grafana: FakeGrafana) -> None:
    api, waits = client(grafana)
    urls = provision(api, DATASOURCE, dashboards(), "up")
    assert grafana.calls[:2] == [f"GET /api/datasources/uid/{DATASOURCE_UID}", "POST /api/datasources"]
    source = grafana.datasources[DATASOURCE_UID]
    assert source["url"] == "https://aps-workspaces.us-east-1.amazonaws.com/workspaces/ws-1234"
    assert source["jsonData"] == {"httpMethod": "POST", "sigV4Auth": True, "sigV4AuthType": "ec2_iam_role",
                                  "sigV4Region": "us-east-1"}
    assert sorted(grafana.dashboards) == sorted(dashboards())
    for uid, posted in grafana.dashboards.items():
        assert posted["overwrite"] is True and posted["dashboard"]["id"] is None
        [variable] = [v for v in posted["dashboard"]["templating"]["list"] if v["name"] == "datasource"]
        assert variable["current"] == {"text": DATASOURCE_UID, "value": DATASOURCE_UID}
        assert posted["dashboard"]["panels"] == dashboards()[uid]["panels"]
    assert urls == [f"{grafana.url}/d/{uid}/x" for uid in sorted(dashboards())]
    assert set(grafana.tokens) == {f"Bearer {TOKEN}"} and waits == []


def test_a_second_run_updates_the_same_data_source_and_dashboards(grafana: FakeGrafana) -> None:
    provision(client(grafana)[0], DATASOURCE, dashboards(), "up")
    before = dict(grafana.dashboards)
    grafana.calls.clear()
    provision(client(grafana)[0], DATASOURCE, dashboards(), "up again")
    assert grafana.calls[:2] == [f"GET /api/datasources/uid/{DATASOURCE_UID}",
                                 f"PUT /api/datasources/uid/{DATASOURCE_UID}"]
    assert list(grafana.datasources) == [DATASOURCE_UID] and sorted(grafana.dashboards) == sorted(before)


def test_a_grafana_that_throttles_or_fails_is_asked_again(grafana: FakeGrafana) -> None:
    grafana.fail = [503, 429, 502]
    api, waits = client(grafana)
    provision(api, DATASOURCE, dashboards(), "up")
    assert waits == [2.0, 4.0, 8.0]
    assert grafana.calls[:4] == [f"GET /api/datasources/uid/{DATASOURCE_UID}"] * 4
    assert sorted(grafana.dashboards) == sorted(dashboards())


def test_a_refused_token_is_one_line_and_nothing_is_retried(grafana: FakeGrafana) -> None:
    api, waits = client(grafana, token="expired")
    with pytest.raises(ProvisionError) as err:
        provision(api, DATASOURCE, dashboards(), "up")
    assert str(err.value).startswith(f"Grafana at {grafana.url} refused GET /api/datasources/uid/"
                                     f"{DATASOURCE_UID}: HTTP 401 ")
    assert "token expired or was revoked?" in str(err.value) and "\n" not in str(err.value)
    assert waits == [] and len(grafana.calls) == 1 and grafana.dashboards == {}


def test_a_grafana_that_never_answers_fails_after_the_attempts(grafana: FakeGrafana) -> None:
    grafana.server.shutdown()
    grafana.server.server_close()
    api, waits = client(grafana, attempts=3)
    with pytest.raises(ProvisionError) as err:
        provision(api, DATASOURCE, dashboards(), "up")
    assert str(err.value).startswith(f"Grafana at {grafana.url} did not answer GET /api/datasources/uid/"
                                     f"{DATASOURCE_UID} after 3 attempts (last: ")
    assert waits == [2.0, 4.0]


def test_the_dynamic_provider_provisions_keeps_no_token_and_runs_again_only_on_change(
        grafana: FakeGrafana) -> None:
    content = json.dumps(dashboards(), sort_keys=True)
    props = {"grafana_url": grafana.url, "token": TOKEN, "datasource": DATASOURCE, "dashboards": content,
             "digest": provisioned_digest(DATASOURCE, content), "message": "up"}
    provider = DashboardsProvider()
    created = provider.create(props)
    assert "token" not in created.outs and len(created.outs["urls"]) == len(dashboards())
    assert created.id.startswith(grafana.url)
    assert provider.diff(created.id, created.outs, {**props, "token": "another"}).changes is False
    changed = {**props, "dashboards": "{}", "digest": provisioned_digest(DATASOURCE, "{}")}
    assert provider.diff(created.id, created.outs, changed).changes is True
    assert provider.update(created.id, created.outs, changed).outs["urls"] == []


def test_pulumi_up_provisions_into_the_stacks_grafana_with_a_short_lived_admin_token() -> None:
    plan = planned("own")
    [account] = plan.of_type("aws:grafana/workspaceServiceAccount:WorkspaceServiceAccount")
    assert account.inputs["grafanaRole"] == "ADMIN" and account.inputs["name"] == "gpucluster-dashboards"
    [token] = plan.of_type("aws:grafana/workspaceServiceAccountToken:WorkspaceServiceAccountToken")
    assert token.inputs["secondsToLive"] == TOKEN_SECONDS == 86_400
    [resource] = plan.of_type("pulumi-python:dynamic:Resource")
    props = resource.inputs
    assert json.loads(props["dashboards"]) == json.loads(json.dumps(rendered(from_spec(plan.spec))))
    ws = plan.outputs["prometheus_remote_write_url"]
    assert props["datasource"]["url"] == amp_query_url(ws)
    assert props["grafana_url"] == plan.outputs["grafana_url"]
    assert token.inputs["name"] == f"gpucluster-dashboards-{props['digest'][:16]}"
    assert props["digest"] == provisioned_digest(props["datasource"], props["dashboards"])


def test_no_grafana_no_provisioning() -> None:
    plan = planned("existing")
    assert not plan.of_type("pulumi-python:dynamic:Resource")
    assert not plan.of_type("aws:grafana/workspaceServiceAccount:WorkspaceServiceAccount")
