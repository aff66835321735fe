"""`observability` in a stack file: its checks (one line per key path), the workspaces and grants a plan
shows under the mock engine, the node side it renders, and metrics.sh under bash with fake binaries."""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from base_config import base, plan_config
from fake_node import logged_calls, os_env, write_stubs
from gpucluster.dashboards.grafana import GRAFANA_VERSION
from gpucluster.node.metrics import (
    DCGM_FIELDS,
    UNKNOWN_WORKSPACE,
    dcgm_fields,
    group_metrics,
    remote_write_url_of,
)
from gpucluster.node.userdata import node_bootstrap, node_files, script
from gpucluster.noderole import metrics_write_policy_document
from gpucluster.plan import MOCK_ACCOUNT
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError, StackSpec
from gpucluster.spec.observability import remote_write_workspace

DIGEST = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04@sha256:" + "ab" * 32
WS = "ws-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"
URL = f"https://aps-workspaces.us-west-2.amazonaws.com/workspaces/{WS}/api/v1/remote_write"
CN_URL = URL.replace("us-west-2.amazonaws.com", "cn-north-1.amazonaws.com.cn")


def with_observability(section: dict[str, Any], config: dict[str, Any] | None = None) -> dict[str, Any]:
    config = config or base()
    config["gpucluster:observability"] = section
    return config


def problems(config: dict[str, Any]) -> list[str]:
    try:
        parse_stack_config(config, stack="t")
    except SpecError as e:
        return [str(f) for f in e.findings]
    return []


ON = {"prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST}}


@pytest.mark.parametrize(("section", "path", "words"), [
    ({"grafana": {"enabled": True}, **ON}, "observability.grafana.authentication_providers", "AWS_SSO"),
    ({"prometheus": {"remote_write_url": "https://example.com/api/v1/write", "region": "us-east-1",
                     "dcgm_exporter_image": DIGEST}}, "observability.prometheus.remote_write_url",
     "Amazon Managed Prometheus remote-write URL"),
    ({"prometheus": {"remote_write_url": CN_URL, "region": "cn-north-1", "dcgm_exporter_image": DIGEST}},
     "observability.prometheus.remote_write_url", "partition aws-cn"),
    ({"prometheus": {"remote_write_url": URL, "dcgm_exporter_image": DIGEST}},
     "observability.prometheus.region", "required with remote_write_url"),
    ({"prometheus": {"remote_write_url": URL, "region": "us-east-2", "dcgm_exporter_image": DIGEST}},
     "observability.prometheus.region", "remote_write_url is in us-west-2"),
    ({"prometheus": {"enabled": True}}, "observability.prometheus.dcgm_exporter_image", "pinned by digest"),
    ({"prometheus": {"enabled": True, "dcgm_exporter_image": "nvcr.io/nvidia/k8s/dcgm-exporter:latest"}},
     "observability.prometheus.dcgm_exporter_image", "must be pinned by digest"),
    ({"prometheus": {"enabled": True, "remote_write_url": URL, "region": "us-west-2",
                     "dcgm_exporter_image": DIGEST}},
     "observability.prometheus.remote_write_url", "not both"),
    ({"grafana": {"enabled": True, "authentication_providers": ["AWS_SSO"]}}, "observability.grafana.enabled",
     "needs observability.prometheus"),
    ({"grafana": {"enabled": True, "authentication_providers": ["SAML"]}, **ON},
     "observability.grafana.saml_metadata_url", "required with SAML"),
    ({"grafana": {"enabled": True, "authentication_providers": ["LDAP"]}, **ON},
     "observability.grafana.authentication_providers[0]", "AWS_SSO"),
    ({"prometheus": {"enabld": True}}, "observability.prometheus.enabld", ""),
])
def test_bad_observability_is_one_line_naming_the_key_path(section: dict[str, Any], path: str,
                                                           words: str) -> None:
    found = problems(with_observability(section))
    assert any(p.startswith(f"gpucluster:{path}:") or p.startswith(f"{path}:") for p in found), found
    assert any(words in p for p in found if path in p), found


def test_observability_on_a_stack_without_gpus_names_the_section() -> None:
    from gpucluster.spec.observability import observability_rules
    spec = parse_stack_config(with_observability(ON), stack="t")
    no_gpu = spec.model_copy(update={"node_groups": [g.model_copy(update={"instance_types": ["x.large"]})
                                                     for g in spec.node_groups]})
    assert [f.path for f in observability_rules(no_gpu)][:1] == ["observability"]


def test_the_cli_refuses_it_with_exit_2_and_one_line(tmp_path: Path) -> None:
    stack = tmp_path / "Pulumi.bad.yaml"
    (tmp_path / "Pulumi.yaml").write_text("name: gpucluster\nruntime: python\n")
    config = with_observability({"grafana": {"enabled": True}, **ON})
    stack.write_text(yaml.safe_dump({"config": config}))
    result = subprocess.run([str(Path(os.sys.executable).parent / "gpucluster"), "plan", str(stack)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "observability.grafana.authentication_providers" in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_remote_write_urls_parse_and_render_the_same() -> None:
    assert remote_write_workspace(URL) == ("us-west-2", WS)
    assert remote_write_url_of("us-west-2", WS) == URL
    cn = remote_write_url_of("cn-north-1", WS)
    assert cn.startswith("https://aps-workspaces.cn-north-1.amazonaws.com.cn/")
    assert remote_write_workspace(cn) == ("cn-north-1", WS)
    assert remote_write_workspace(URL.replace(".com/", ".com.cn/")) is None  # .cn outside China


def test_the_node_may_only_remote_write_to_its_workspace() -> None:
    arn = f"arn:aws:aps:us-west-2:123456789012:workspace/{WS}"
    doc = metrics_write_policy_document(arn, "o/p/s/c")
    assert doc["Statement"] == [{"Sid": "RemoteWriteOwnWorkspaceOnly", "Effect": "Allow",
                                 "Action": ["aps:RemoteWrite"], "Resource": [arn],
                                 "Condition": {"StringEquals": {
                                     "aws:ResourceTag/gpucluster:stack": "o/p/s/c"}}}]
    assert "Condition" not in metrics_write_policy_document(arn)["Statement"][0]


@cache
def planned(kind: str) -> Any:
    config = base()
    config["gpucluster:node_groups"] = [
        {"name": "train", "instance_types": ["p5.48xlarge"], "max_nodes": 2},
        {"name": "infer", "instance_types": ["p4d.24xlarge"], "max_nodes": 1}]
    # Not a MIG group here: a MIG group with the collector has its own test
    # (test_a_mig_p4d_group_with_metrics_plans_its_scripts_fetched_from_the_bundle).
    sections = {
        "own": {"prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST},
                "grafana": {"enabled": True, "authentication_providers": ["AWS_SSO"], "editors": 2}},
        "existing": {"prometheus": {"remote_write_url": URL, "region": "us-west-2",
                                    "dcgm_exporter_image": DIGEST}},
    }
    return plan_config(with_observability(sections[kind], config))


def test_plan_shows_the_workspace_encrypted_tagged_with_the_rules_and_grafana() -> None:
    plan = planned("own")
    [ws] = plan.of_type("aws:amp/workspace:Workspace")
    [key] = [r for r in plan.of_type("aws:kms/key:Key") if "Prometheus" in str(r.inputs.get("description"))]
    assert key.inputs["enableKeyRotation"] is True
    assert ws.inputs["kmsKeyArn"] and ws.inputs["tags"]["gpucluster:stack"] == plan.spec.identity
    [rules] = plan.of_type("aws:amp/ruleGroupNamespace:RuleGroupNamespace")
    groups = yaml.safe_load(rules.inputs["data"])["groups"]
    alerts = {r.get("alert") for r in groups[1]["rules"]}
    assert "GpuXidError" in alerts and "MigLayoutWrong" not in alerts  # no MIG group in this stack
    [grafana] = plan.of_type("aws:grafana/workspace:Workspace")
    assert grafana.inputs["authenticationProviders"] == ["AWS_SSO"]
    assert grafana.inputs["permissionType"] == "CUSTOMER_MANAGED"
    assert grafana.inputs["dataSources"] == ["PROMETHEUS"]
    # the Grafana the dashboards are written for, never AWS's default of the day
    assert grafana.inputs["grafanaVersion"] == GRAFANA_VERSION == "10.4"
    # CreateWorkspace has no resource type: the deploy role may make one only with the stack tag in the
    # request (infra/bootstrap-state CreatesWithoutResourceType)
    assert grafana.inputs["tags"]["gpucluster:stack"] == plan.spec.identity
    [role] = [r for r in plan.of_type("aws:iam/role:Role") if "grafana" in r.name]
    trust = json.loads(role.inputs["assumeRolePolicy"])["Statement"][0]
    assert trust["Principal"] == {"Service": "grafana.amazonaws.com"} and "aws:SourceAccount" in str(trust)
    [query] = [r for r in plan.of_type("aws:iam/rolePolicy:RolePolicy") if r.name.endswith("-grafana-query")]
    statements = json.loads(query.inputs["policy"])["Statement"]
    assert statements[0]["Action"] == ["aps:GetLabels", "aps:GetMetricMetadata", "aps:GetSeries",
                                       "aps:QueryMetrics"]
    assert "RemoteWrite" not in query.inputs["policy"]
    assert plan.outputs["grafana_url"].startswith("https://")
    assert plan.outputs["prometheus_remote_write_url"].endswith("/api/v1/remote_write")


def test_each_node_role_gets_remote_write_on_that_workspace_only() -> None:
    plan = planned("own")
    grants = [r for r in plan.of_type("aws:iam/rolePolicy:RolePolicy") if "-metrics-write-" in r.name]
    assert sorted(g.name.rsplit("-", 1)[1] for g in grants) == ["infer", "train"]
    for grant in grants:
        [statement] = json.loads(grant.inputs["policy"])["Statement"]
        assert statement["Action"] == ["aps:RemoteWrite"]
        # The workspace's own ARN (the mock engine's stand-in: arn:aws:<module>:<region>:<account>:<name>).
        [ws] = plan.of_type("aws:amp/workspace:Workspace")
        assert statement["Resource"] == [f"arn:aws:amp:us-east-1:{MOCK_ACCOUNT}:{ws.name}"]


def test_an_existing_workspace_makes_no_workspace_and_grants_its_arn() -> None:
    plan = planned("existing")
    assert not plan.of_type("aws:amp/workspace:Workspace")
    assert not plan.of_type("aws:grafana/workspace:Workspace")
    grants = [r for r in plan.of_type("aws:iam/rolePolicy:RolePolicy") if "-metrics-write-" in r.name]
    arns = {json.loads(g.inputs["policy"])["Statement"][0]["Resource"][0] for g in grants}
    [arn] = arns
    assert arn.startswith("arn:aws:aps:us-west-2:") and arn.endswith(f":workspace/{WS}")


def user_data_files(plan: Any, group: str) -> str:
    [lt] = [r for r in plan.of_type("aws:ec2/launchTemplate:LaunchTemplate") if f"-{group}-" in r.name]
    return gzip.decompress(base64.b64decode(lt.inputs["userData"])).decode()


def test_the_nodes_user_data_carries_the_collector_and_the_workspace_url() -> None:
    plan = planned("own")
    text = user_data_files(plan, "infer")
    assert "/usr/local/sbin/gpucluster-metrics" in text and "DCGM_FI_PROF_SM_ACTIVE" in text
    assert f"GPUCLUSTER_DCGM_EXPORTER_IMAGE={DIGEST}" in text
    assert "GPUCLUSTER_REMOTE_WRITE_URL=https://aps-workspaces.us-east-1.amazonaws.com/workspaces/" in text
    assert UNKNOWN_WORKSPACE not in text
    assert "Wants=gpucluster-metrics.service" in text
    # Nothing a job, the health check or the launch hook waits for depends on it.
    for unit in ("gpucluster-health-launch.service", "gpucluster-setup.service"):
        block = text.split(f"{unit} <<", 1)[1].split("GPUCLUSTER_FILE_EOF", 2)[1]
        assert "gpucluster-metrics" not in block


def spec_with(section: dict[str, Any]) -> StackSpec:
    return parse_stack_config(with_observability(section), stack="t")


def test_off_renders_no_metrics_files() -> None:
    spec = parse_stack_config(base(), stack="t")
    assert not any("metrics" in f.path for f in node_files(node_bootstrap(spec, spec.node_groups[0])))
    assert group_metrics(spec.observability, spec.region) is None


# ------------------------------------------------------------------- metrics.sh under bash


def run_metrics(tmp_path: Path, *args: str, bodies: dict[str, str],
                extra_env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], Path]:
    log = tmp_path / "calls.log"
    write_stubs(tmp_path / "bin", log, bodies)
    (tmp_path / "node.env").write_text("GPUCLUSTER_STACK='o/p/dev/demo'\nGPUCLUSTER_NODE_GROUP=train\n")
    (tmp_path / "metrics.env").write_text(
        f"GPUCLUSTER_REMOTE_WRITE_URL={URL}\nGPUCLUSTER_REMOTE_WRITE_REGION=us-west-2\n"
        f"GPUCLUSTER_DCGM_EXPORTER_IMAGE={DIGEST}\nGPUCLUSTER_METRICS_SCRAPE_SECONDS=30\n"
        f"GPUCLUSTER_DCGM_FIELDS='{dcgm_fields()}'\n")
    path = tmp_path / "metrics.sh"
    path.write_text(script("metrics.sh"))
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "GPUCLUSTER_NODE_ENV": str(tmp_path / "node.env"),
           "GPUCLUSTER_METRICS_ENV": str(tmp_path / "metrics.env"),
           "GPUCLUSTER_PROMETHEUS_CONFIG": str(tmp_path / "prometheus.yml"),
           "GPUCLUSTER_METRICS_CHECK_SECONDS": "0",
           "GPUCLUSTER_DCGM_COUNTERS": str(tmp_path / "counters.csv"), **os_env(tmp_path / "os"),
           # The collector counts as installed when these exist: the stubs (the real ones may be here too).
           "GPUCLUSTER_METRICS_BINARIES": " ".join(str(tmp_path / "bin" / b)
                                                   for b in ("prometheus", "prometheus-node-exporter")),
           **(extra_env or {})}
    result = subprocess.run(["bash", str(path), *args], env=env, capture_output=True, text=True, timeout=60)
    return result, log


IMDS_CURL = ('case "$*" in *api/token*) echo tok ;; *instance-id*) echo i-0abc ;; '
             '*instance-type*) echo p5.48xlarge ;; *9090/metrics*) printf "%s\\n" "$PROM_METRICS" ;; esac')
START_STUBS = {"curl": IMDS_CURL, "docker": "", "systemctl": "", "promtool": "", "logger": "",
               "prometheus": "", "prometheus-node-exporter": "", "apt-get": ""}


def test_start_renders_labelled_sigv4_config_and_runs_the_pinned_exporter(tmp_path: Path) -> None:
    result, log = run_metrics(tmp_path, "start", bodies=START_STUBS)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    assert config["remote_write"][0] == {"url": URL, "sigv4": {"region": "us-west-2"},
                                         "queue_config": {"max_samples_per_send": 1000, "max_shards": 20}}
    assert {j["job_name"]: j["static_configs"][0]["labels"] for j in config["scrape_configs"]} == {
        job: {"gpucluster_stack": "o/p/dev/demo", "node_group": "train", "instance_id": "i-0abc",
              "instance_type": "p5.48xlarge"} for job in ("dcgm-exporter", "node-exporter")}
    counters = (tmp_path / "counters.csv").read_text().splitlines()
    assert counters == [f"{name}, {kind}, {name}" for name, kind in DCGM_FIELDS]
    assert "DCGM_FI_PROF_SM_ACTIVE, gauge, DCGM_FI_PROF_SM_ACTIVE" in counters
    [run] = [c for c in logged_calls(log, "docker") if c.startswith("run")]
    assert DIGEST in run and "127.0.0.1:9400:9400" in run and "--cap-add SYS_ADMIN" in run
    assert "enable --now gpucluster-prometheus" in logged_calls(log, "systemctl")
    assert logged_calls(log, "apt-get") == []  # already installed: nothing downloaded


def test_start_installs_the_collector_from_the_archive_when_missing(tmp_path: Path) -> None:
    stubs = {k: v for k, v in START_STUBS.items() if k not in ("prometheus", "prometheus-node-exporter")}
    result, log = run_metrics(tmp_path, "start", bodies=stubs)
    assert result.returncode == 0, result.stderr
    assert logged_calls(log, "apt-get")[0].endswith("install -y --no-install-recommends prometheus "
                                                    "prometheus-node-exporter")


def test_start_fails_when_the_exporter_cannot_start(tmp_path: Path) -> None:
    result, _ = run_metrics(tmp_path, "start", bodies={**START_STUBS, "docker": "exit 1"})
    assert result.returncode != 0


def test_check_says_writing_when_samples_leave(tmp_path: Path) -> None:
    metrics = 'prometheus_remote_storage_samples_total{remote_name="a",url="x"} 1520\n'
    result, _ = run_metrics(tmp_path, "check", bodies=START_STUBS, extra_env={"PROM_METRICS": metrics})
    assert result.returncode == 0, result.stderr
    assert "writing to" in result.stdout and "1520 samples sent" in result.stdout


def test_check_says_not_writing_in_the_boot_log_and_fails_the_step(tmp_path: Path) -> None:
    metrics = ('prometheus_remote_storage_samples_total{remote_name="a",url="x"} 0\n'
               'prometheus_remote_storage_samples_failed_total{remote_name="a",url="x"} 300\n')
    result, log = run_metrics(tmp_path, "check", bodies=START_STUBS, extra_env={"PROM_METRICS": metrics})
    assert result.returncode == 1
    assert "NOT WRITING" in result.stdout and "300 samples failed" in result.stdout
    assert any("NOT WRITING" in c for c in logged_calls(log, "logger"))


def test_check_when_prometheus_does_not_answer(tmp_path: Path) -> None:
    result, _ = run_metrics(tmp_path, "check", bodies={**START_STUBS, "curl": "exit 7"})
    assert result.returncode == 1 and "NOT WRITING" in result.stdout


def test_metrics_script_lints() -> None:
    from test_bootstrap import lint
    path = Path(__file__).parent.parent / "components" / "gpucluster" / "node" / "metrics.sh"
    lint(path)


# ------------------------------------------------------------------- cost


def test_cost_prices_amp_by_the_sample_rate_and_amg_by_users() -> None:
    from gpucluster.node.metrics import DCGM_FIELDS
    from gpucluster.pricing import (
        NODE_EXPORTER_SERIES,
        amp_ingest_usd,
        metric_series_per_node,
        price_stack,
        service_prices,
    )
    config = base()
    config["gpucluster:node_groups"] = [
        {"name": "train", "instance_types": ["p5.48xlarge"], "max_nodes": 4, "desired_nodes": 2}]
    section = {"prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST,
                              "scrape_interval_seconds": 15},
               "grafana": {"enabled": True, "authentication_providers": ["AWS_SSO"], "editors": 3,
                           "viewers": 10}}
    spec = parse_stack_config(with_observability(section, config), stack="t")
    cost = price_stack(spec)
    other = {o.kind: o for o in cost.other}
    series = 8 * len(DCGM_FIELDS) + NODE_EXPORTER_SERIES + 10
    assert metric_series_per_node(spec.node_groups[0]) == series
    samples = series * 240 * 730 * 2  # 4 scrapes a minute, all month, 2 nodes
    prices = service_prices("us-east-1")
    stored_gb = samples * 2 * 150 / (730 / 24) / 1e9
    assert other["amp"].desired_usd_per_month == pytest.approx(
        amp_ingest_usd(samples, prices) + stored_gb * 0.03)
    assert other["amp"].max_usd_per_month == pytest.approx(2 * other["amp"].desired_usd_per_month, rel=0.01)
    assert other["amg"].desired_usd_per_month == 3 * 9 + 10 * 5
    assert "15 s" in other["amp"].basis and other["amp"].source.startswith("Amazon Managed Service")
    # The tier: the first 2 billion samples at $0.90 per 10 million, the rest at $0.35.
    assert amp_ingest_usd(3e9, prices) == pytest.approx(2e9 / 1e7 * 0.90 + 1e9 / 1e7 * 0.35)
    del config["gpucluster:observability"]
    off = price_stack(parse_stack_config(config, stack="t"))
    assert not {"amp", "amg"} & {o.kind for o in off.other}


def test_the_node_roles_inline_policy_size_counts_the_metrics_grant(monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    import gpucluster.preflight as preflight
    from gpucluster.noderole import longest_metrics_write_policy, policy_chars

    monkeypatch.setattr(preflight, "ROLE_INLINE_POLICIES_MAX_CHARS", 0)  # every size is reported

    def chars(config: dict[str, Any]) -> int:
        [finding] = preflight.node_role_size(spec_of_config(config))
        return int(re.search(r"reach (\d+) characters", finding.message)[1])  # type: ignore[index]

    off, on = chars(base()), chars(with_observability(ON))
    assert on - off == policy_chars(longest_metrics_write_policy(spec_of_config(base()).identity))


def spec_of_config(config: dict[str, Any]) -> StackSpec:
    from gpucluster.spec import parse_stack_config as parse_spec_only
    return parse_spec_only(config, stack="t")


def test_a_mig_p4d_group_with_metrics_plans_its_scripts_fetched_from_the_bundle() -> None:
    """EC2's 16 KiB of user data: inline, a MIG group with gpucluster-mig and the collector rendered
    16,451 bytes gzipped and was refused. The shipped scripts now come from the stack's node scripts
    bundle (gpucluster.node.bundle), so it plans, with its user data measured at 4,049 bytes
    gzipped at preflight's longest names (4,084 of the 16,256 allowed as planned)."""
    from gpucluster.node.bundle import bundle_key, bundle_sha256
    from gpucluster.node.userdata import MAX_USER_DATA_BYTES, gzipped_size
    from gpucluster.preflight import USER_DATA_MARGIN_BYTES

    config = base()
    config["gpucluster:node_groups"] = [
        {"name": "infer", "instance_types": ["p4d.24xlarge"], "max_nodes": 1, "mig": {"profile": "3g.20gb"}}]
    config = with_observability({"prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST}}, config)
    spec = parse_stack_config(config, stack="dev")  # user_data_size among the checks: no finding
    group = spec.node_groups[0]
    assert gzipped_size(node_bootstrap(spec, group)) > MAX_USER_DATA_BYTES  # what inline would need
    plan = plan_config(config, stack="dev")
    [template] = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    packed = base64.b64decode(template.inputs["userData"])
    assert len(packed) < 4300, len(packed)  # measured 4,084 bytes
    assert len(packed) <= MAX_USER_DATA_BYTES - USER_DATA_MARGIN_BYTES - 12_000
    text = gzip.decompress(packed).decode()
    assert f" {bundle_key()} {MOCK_ACCOUNT} {bundle_sha256()} " in text
    assert "install -m 0755 /usr/local/lib/gpucluster/scripts/mig.sh /usr/local/sbin/gpucluster-mig" in text
    assert ("install -m 0755 /usr/local/lib/gpucluster/scripts/metrics.sh "
            "/usr/local/sbin/gpucluster-metrics") in text
    assert "GPUCLUSTER_MIG_LAYOUTS=" in text and "GPUCLUSTER_REMOTE_WRITE_URL=" in text
