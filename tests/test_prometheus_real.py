"""Every PromQL expression of the dashboards, recording and alert rules, evaluated by a real Prometheus.

A session fixture starts Debian's `prometheus` binary (2.42; `.ci/run` installs it) on a free port with
a temporary config: the scrape jobs are the ones the node script (metrics.sh) renders, pointed at a
local HTTP server that serves recorded dcgm-exporter output (tests/data/dcgm: an H100 node at work, an
idle H100 node whose GPU 3 raised XID 79, and an A100 node in MIG mode, 2 x 3g.20gb per GPU, one GPU
with the application XID 13). The rules are the stack's own, evaluated every second.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucluster.dashboards import alerts, dashboards, rules_document
from gpucluster.dashboards.grafana import Panel, rendered
from gpucluster.dashboards.promql import GroupMetrics, MetricsSettings
from gpucluster.node.userdata import script

DATA = Path(__file__).parent / "data" / "dcgm"
PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="Debian's prometheus binary is not installed "
                                "(apt-get install -y prometheus; .ci/run installs it)")
IDENTITY = "organization/gpucluster/dev/demo"
PRICE_H100 = 98.32 / 8
# (fixture, node group, instance id, instance type)
NODES = [("h100-clean", "train", "i-0a1b2c3d4e5f60001", "p5.48xlarge"),
         ("h100-xid", "batch", "i-0a1b2c3d4e5f60002", "p5.48xlarge"),
         ("a100-mig", "infer", "i-0a1b2c3d4e5f60003", "p4d.24xlarge")]
SETTINGS = MetricsSettings(
    identity=IDENTITY,
    groups=(GroupMetrics("train"), GroupMetrics("batch"), GroupMetrics("infer", mig_instances_per_gpu=2)),
    idle_threshold_percent=5, idle_minutes=0.05, gpus_by_type={"p5.48xlarge": 8, "p4d.24xlarge": 8},
    gpu_hour_usd_by_type={"p5.48xlarge": PRICE_H100}, evaluation_seconds=1, exporter_down_minutes=1)
ALL_GPUS = 24
MIG_INSTANCES = 16


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Exporter(http.server.BaseHTTPRequestHandler):
    """Serves /<fixture> as dcgm-exporter would, /node as a node exporter (one gauge)."""

    def do_GET(self) -> None:
        name = self.path.strip("/")
        body = (b"# TYPE node_load1 gauge\nnode_load1 0.25\n"
                b'# TYPE node_cpu_seconds_total counter\nnode_cpu_seconds_total{cpu="0",mode="idle"} 9.5\n'
                if name == "node"
                else (DATA / f"{name}.prom").read_bytes())
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        with contextlib.suppress(BrokenPipeError):  # Prometheus gave up on a scrape while stopping
            self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def node_config(tmp: Path, group: str, instance_id: str, instance_type: str) -> dict[str, Any]:
    """The collector config metrics.sh renders on a node (bash, the shipped script)."""
    env_file, metrics_env = tmp / f"{instance_id}.env", tmp / f"{instance_id}.metrics.env"
    env_file.write_text(f"GPUCLUSTER_STACK='{IDENTITY}'\nGPUCLUSTER_NODE_GROUP={group}\n")
    metrics_env.write_text("GPUCLUSTER_REMOTE_WRITE_URL=https://aps-workspaces.us-east-1.amazonaws.com/"
                           "workspaces/ws-00000000-0000-0000-0000-000000000000/api/v1/remote_write\n"
                           "GPUCLUSTER_REMOTE_WRITE_REGION=us-east-1\nGPUCLUSTER_METRICS_SCRAPE_SECONDS=1\n")
    config = tmp / f"{instance_id}.yml"
    path = tmp / "metrics.sh"
    path.write_text(script("metrics.sh"))
    subprocess.run(["bash", str(path), "render", instance_id, instance_type], check=True, timeout=30,
                   env={"PATH": os.environ["PATH"], "GPUCLUSTER_NODE_ENV": str(env_file),
                        "GPUCLUSTER_METRICS_ENV": str(metrics_env),
                        "GPUCLUSTER_PROMETHEUS_CONFIG": str(config)})
    return yaml.safe_load(config.read_text())


class Prom:
    def __init__(self, url: str, configs: dict[str, dict[str, Any]]) -> None:
        self.url, self.configs = url, configs

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as r:
            answer = json.load(r)
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return list(data["result"])


@pytest.fixture(scope="session")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    tmp = tmp_path_factory.mktemp("prometheus")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    exporter = f"127.0.0.1:{server.server_address[1]}"
    jobs: dict[str, list[dict[str, Any]]] = {}
    relabel: dict[str, Any] = {}
    configs = {}
    for fixture, group, instance_id, instance_type in NODES:
        rendered_config = configs[instance_id] = node_config(tmp, group, instance_id, instance_type)
        for job in rendered_config["scrape_configs"]:
            relabel[job["job_name"]] = job.get("metric_relabel_configs", [])
            for static in job["static_configs"]:
                path = fixture if job["job_name"] == "dcgm-exporter" else "node"
                jobs.setdefault(job["job_name"], []).append(
                    {"targets": [exporter], "labels": {**static["labels"], "__metrics_path__": f"/{path}"}})
    (tmp / "rules.yml").write_text(yaml.safe_dump(rules_document(SETTINGS)))
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(tmp / "rules.yml")],
              "scrape_configs": [{"job_name": name, "static_configs": statics,
                                  "metric_relabel_configs": relabel[name]} for name, statics in jobs.items()]}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    assert PROMETHEUS is not None
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w"))  # noqa: SIM115
    p = Prom(f"http://127.0.0.1:{port}", configs)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
            try:
                if (len(p.query("gpucluster:node_group:idle")) == 3
                        and len(p.query("gpucluster:node_group:idle == 1")) == 1
                        and any(a["state"] == "firing" for a in p.get("/api/v1/alerts")["alerts"])
                        and len(p.query("sum_over_time(gpucluster:node_group:idle_gpus[1h])")) == 3):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-3000:]
            time.sleep(0.5)
        # Rates need two samples: wait until every dcgm-exporter series has two in the last minute.
        dcgm = '{__name__=~"DCGM_.+", job="dcgm-exporter"}'
        while any(len(s["values"]) < 2 for s in p.get("/api/v1/query", query=f"{dcgm}[1m]")["result"]):
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (tmp / "prometheus.log").read_text()[-3000:]
            time.sleep(0.25)
        yield p
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        server.shutdown()


def concrete(expr: str, **variables: str) -> str:
    """A panel's query as Grafana sends it: the dashboard variables and range macros filled in."""
    values = {"$node_group": ".*", "$instance_id": ".*", "$__range": "1h", "$__rate_interval": "1m",
              **variables}
    for name, value in values.items():
        expr = expr.replace(name, value)
    return expr


def panels(uid: str) -> list[Panel]:
    return [p for d in dashboards(SETTINGS) if d.uid == uid for p in d.panels]


def test_rules_load_and_the_node_config_is_a_valid_prometheus_config(prom: Prom, tmp_path: Path) -> None:
    rules = prom.get("/api/v1/rules")["groups"]
    assert {g["name"] for g in rules} == {"gpucluster-recording", "gpucluster-health"}
    assert all(r["health"] == "ok" for g in rules for r in g["rules"]), [
        (r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r["health"] != "ok"]
    promtool = shutil.which("promtool")
    if promtool:
        config = tmp_path / "node.yml"
        config.write_text(yaml.safe_dump(next(iter(prom.configs.values()))))
        result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_node_exporter_keeps_only_the_families_priced(prom: Prom) -> None:
    assert len(prom.query('node_load1{job="node-exporter"}')) == 3
    assert prom.query('node_cpu_seconds_total{job="node-exporter"}') == []


def test_the_nodes_labels_reach_every_dcgm_series(prom: Prom) -> None:
    series = prom.query(f'DCGM_FI_DEV_GPU_TEMP{{gpucluster_stack="{IDENTITY}"}}')
    seen = {(s["metric"]["node_group"], s["metric"]["instance_id"], s["metric"]["instance_type"])
            for s in series}
    assert seen == {(g, i, t) for _, g, i, t in NODES}
    assert all(s["metric"]["Hostname"] and s["metric"]["UUID"].startswith("GPU-") for s in series)


@pytest.mark.parametrize("panel", panels("gpucluster-node-group"), ids=lambda p: p.title)
def test_every_node_group_panel_returns_one_series_per_gpu(prom: Prom, panel: Panel) -> None:
    for target in panel.targets:
        result = prom.query(concrete(target.expr))
        gpus = {(s["metric"]["instance_id"], s["metric"]["gpu"]) for s in result}
        assert len(gpus) == len(result) == ALL_GPUS, (panel.title, target.expr, len(result))
        assert all(set(panel.per) <= set(s["metric"]) for s in result)


@pytest.mark.parametrize("panel", panels("gpucluster-node"), ids=lambda p: p.title)
def test_every_node_panel_shows_that_nodes_gpus_only(prom: Prom, panel: Panel) -> None:
    for target in panel.targets:
        result = prom.query(concrete(target.expr, **{"$instance_id": "i-0a1b2c3d4e5f60003"}))
        assert sorted(int(s["metric"]["gpu"]) for s in result) == list(range(8)), panel.title
        assert {s["metric"]["instance_type"] for s in result} == {"p4d.24xlarge"}


@pytest.mark.parametrize("panel", panels("gpucluster-mig"), ids=lambda p: p.title)
def test_every_mig_panel_returns_one_series_per_mig_instance(prom: Prom, panel: Panel) -> None:
    result = prom.query(concrete(panel.targets[0].expr))
    instances = {(s["metric"]["gpu"], s["metric"]["GPU_I_ID"]) for s in result}
    assert len(instances) == len(result) == MIG_INSTANCES, panel.title
    assert {s["metric"]["GPU_I_PROFILE"] for s in result} == {"3g.20gb"}
    assert {s["metric"]["node_group"] for s in result} == {"infer"}


def value(result: list[dict[str, Any]]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


def test_cluster_overview_counts_busy_gpus_nodes_by_state_and_idle_waste(prom: Prom) -> None:
    by_title = {p.title: p for p in panels("gpucluster-overview")}
    # Busy: the H100 at work (97 %) and the MIG A100 (41 % graphics activity); the XID node is idle.
    assert value(prom.query(concrete(by_title["GPUs busy"].targets[0].expr))) == 16
    assert value(prom.query(concrete(by_title["GPUs"].targets[0].expr))) == ALL_GPUS
    busy, idle, silent = (value(prom.query(concrete(t.expr))) for t in by_title["Nodes by state"].targets)
    assert (busy, idle, silent) == (2, 1, 0)
    groups = {s["metric"]["node_group"]: float(s["value"][1])
              for s in prom.query(concrete(by_title["Idle node groups"].targets[0].expr))}
    assert groups == {"train": 0, "batch": 1, "infer": 0}
    idle_gpus = prom.query(concrete(by_title["Idle GPUs by node group"].targets[0].expr))
    assert {(s["metric"]["node_group"], float(s["value"][1])) for s in idle_gpus} == {
        ("train", 0), ("batch", 8), ("infer", 0)}
    hours = value(prom.query(concrete(by_title["Idle GPU-hours"].targets[0].expr)))
    cost = value(prom.query(concrete(by_title["Idle GPU cost"].targets[0].expr)))
    # One evaluation a second: 8 idle GPUs for n seconds are 8 n / 3600 GPU-hours, at the H100 price.
    assert hours > 0 and hours * 3600 % 8 == pytest.approx(0, abs=1e-6)
    assert cost == pytest.approx(hours * PRICE_H100)
    for target in (t for p in by_title.values() for t in p.targets):
        assert prom.query(concrete(target.expr)), target.expr


def test_alerts_fire_on_the_recorded_xid_and_stay_quiet_on_the_clean_nodes(prom: Prom) -> None:
    alerts = [a for a in prom.get("/api/v1/alerts")["alerts"] if a["state"] in ("firing", "pending")]
    assert [(a["labels"]["alertname"], a["labels"]["instance_id"], a["labels"]["gpu"], a["value"])
            for a in alerts] == [("GpuXidError", "i-0a1b2c3d4e5f60002", "3", "7.9e+01")]
    assert alerts[0]["labels"]["finding"] == "xid"
    # Every alert rule was evaluated without error; the quiet ones on data that has their series.
    for name in ("GpuUncorrectableEcc", "GpuMemoryRemapPending", "GpuMissing", "MigLayoutWrong"):
        rule = next(r for g in prom.get("/api/v1/rules")["groups"] for r in g["rules"] if r["name"] == name)
        assert rule["health"] == "ok" and rule["state"] == "inactive", rule


def test_the_alert_expressions_fire_when_their_condition_is_in_the_data(prom: Prom) -> None:
    """The quiet alerts are not quiet because their query cannot match: the same expressions with the
    threshold moved onto values the recording holds do return the series."""
    rules = {a.name: a.expr for a in alerts(SETTINGS)}
    # Corrected ECC counts (GPU 1 of each node holds 2): the same shape as the uncorrectable rule.
    assert len(prom.query(rules["GpuUncorrectableEcc"].replace("DBE", "SBE"))) == 3
    # A node that saw fewer GPUs than its type: compare against one more GPU than each type has.
    assert len(prom.query(rules["GpuMissing"].replace(
        "group_left gpucluster:instance_type:gpus", "group_left() (1 + gpucluster:instance_type:gpus)"))) == 3
    assert len(prom.query(rules["MigLayoutWrong"].replace("(2 *", "(3 *"))) == 1
    # The application XID 13 on the MIG node is there, and filtered out by the rule.
    assert len(prom.query(rules["GpuXidError"].replace("!= 13", "!= 12"))) == 2


def test_exported_dashboards_hold_exactly_the_queries_tested(prom: Prom) -> None:
    exported = rendered(SETTINGS)
    queries = {t["expr"] for d in exported.values() for p in d["panels"] for t in p["targets"]}
    tested = {t.expr for d in dashboards(SETTINGS) for p in d.panels for t in p.targets}
    assert queries == tested
    for d in exported.values():
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                label = v["query"]["query"].rsplit(", ", 1)[1].rstrip(")")
                expr = concrete(v["query"]["query"].split("(", 1)[1].rsplit(", ", 1)[0])
                assert {s["metric"][label] for s in prom.query(expr)}, v["name"]


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="Debian's promtool is not installed (it comes with prometheus)")
def test_idle_is_the_idle_stops_definition_in_simulated_time(tmp_path: Path) -> None:
    """`promtool test rules`: a group whose busiest GPU stays below the threshold for the whole
    window is idle, not before the window is covered (missing data is never idle), and not while one
    busy minute is inside the window; its idle GPUs are priced by the GPU-hour."""
    settings = MetricsSettings(identity="s", groups=(GroupMetrics("quiet"), GroupMetrics("burst")),
                               idle_threshold_percent=5, idle_minutes=5,
                               gpus_by_type={"p5.48xlarge": 8}, gpu_hour_usd_by_type={"p5.48xlarge": 12.5})
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules_document(settings)))

    def gpu(group: str, index: int) -> str:
        return (f'DCGM_FI_DEV_GPU_UTIL{{gpucluster_stack="s",node_group="{group}",instance_id="i-{group}",'
                f'instance_type="p5.48xlarge",gpu="{index}",UUID="GPU-{group}-{index}"}}')

    def idle(at: str, quiet: int, burst: int) -> dict[str, Any]:
        return {"expr": "gpucluster:node_group:idle", "eval_time": at, "exp_samples": [
            {"labels": f'gpucluster:node_group:idle{{gpucluster_stack="s",node_group="{g}"}}', "value": v}
            for g, v in (("quiet", quiet), ("burst", burst))]}

    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [
            {"series": gpu("quiet", 0), "values": "3x20"}, {"series": gpu("quiet", 1), "values": "0x20"},
            {"series": gpu("burst", 0), "values": "0 0 0 0 0 0 80 " + "0 " * 14},
        ],
        "promql_expr_test": [
            idle("3m", 0, 0),    # four of the window's five minutes: not covered yet
            idle("5m", 1, 1),    # five minutes below 5 %: idle, both
            idle("8m", 1, 0),    # the burst's 80 % at 6m is inside the window
            idle("12m", 1, 1),   # and out of it again
            {"expr": "gpucluster:node_group:idle_cost_usd_per_hour", "eval_time": "8m", "exp_samples": [
                {"labels": 'gpucluster:node_group:idle_cost_usd_per_hour{gpucluster_stack="s",'
                           'instance_type="p5.48xlarge",node_group="quiet"}', "value": 25},
                {"labels": 'gpucluster:node_group:idle_cost_usd_per_hour{gpucluster_stack="s",'
                           'instance_type="p5.48xlarge",node_group="burst"}', "value": 0}]},
        ],
    }]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    assert PROMTOOL is not None
    result = subprocess.run([PROMTOOL, "test", "rules", str(tmp_path / "test.yml")], capture_output=True,
                            text=True, cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
