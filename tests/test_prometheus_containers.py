"""Prometheus and the node exporter as containers pinned by digest (observability.prometheus.prometheus_image
and node_exporter_image, #34 item 6): the stack file's check, what a node gets, metrics.sh's `start` and
`serve` under bash on both OS families (docker, systemctl, curl and install are stubs that log their calls,
as in test_prometheus_stack.py), and doctor on an Amazon Linux 2023 AMI.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from base_config import base
from fake_node import logged_calls, os_env
from gpucluster.node.metrics import PROMETHEUS_DATA, PROMETHEUS_RETENTION, group_metrics
from gpucluster.node.userdata import metrics_files, node_bootstrap, node_files, prometheus_unit
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError
from test_prometheus_stack import DIGEST, START_STUBS, run_metrics

PROMETHEUS = "quay.io/prometheus/prometheus:v2.55.1@sha256:" + "cd" * 32
NODE_EXPORTER = "quay.io/prometheus/node-exporter:v1.8.2@sha256:" + "ef" * 32
IMAGES = {"GPUCLUSTER_PROMETHEUS_IMAGE": PROMETHEUS, "GPUCLUSTER_NODE_EXPORTER_IMAGE": NODE_EXPORTER}
KEYS = ("observability.prometheus.prometheus_image", "observability.prometheus.node_exporter_image")
SYSTEMS = ("ubuntu-22.04", "ubuntu-24.04", "al2023")
# No prometheus binaries on the machine: what an Amazon Linux 2023 or a bare Ubuntu node has.
NO_BINARIES = {k: v for k, v in START_STUBS.items() if k not in ("prometheus", "prometheus-node-exporter")}


def stack(**prometheus: Any) -> dict[str, Any]:
    config = base()
    config["gpucluster:observability"] = {"prometheus": {"enabled": True, "dcgm_exporter_image": DIGEST,
                                                         **prometheus}}
    return config


def both() -> dict[str, Any]:
    return stack(prometheus_image=PROMETHEUS, node_exporter_image=NODE_EXPORTER)


def findings(config: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    return [str(f) for f in err.value.findings]


# ------------------------------------------------------------------- the stack file


@pytest.mark.parametrize("key", ["prometheus_image", "node_exporter_image"])
def test_a_collector_image_without_a_digest_is_one_finding_naming_it(key: str) -> None:
    images = {"prometheus_image": PROMETHEUS, "node_exporter_image": NODE_EXPORTER}
    images[key] = images[key].split("@", 1)[0]
    [finding] = findings(stack(**images))
    assert finding.startswith(f"observability.prometheus.{key}: must be pinned by digest")


@pytest.mark.parametrize(("given", "missing"), [
    ({"prometheus_image": PROMETHEUS}, "node_exporter_image"),
    ({"node_exporter_image": NODE_EXPORTER}, "prometheus_image")])
def test_one_collector_image_without_the_other_names_the_missing_key(given: dict[str, str],
                                                                      missing: str) -> None:
    [finding] = findings(stack(**given))
    assert finding.startswith(f"observability.prometheus.{missing}: required with ")


def test_a_bad_collector_image_exits_2_with_one_line(tmp_path: Path) -> None:
    import yaml
    from typer.testing import CliRunner

    from gpucluster.cli import app
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": stack(prometheus_image="quay.io/prometheus/prometheus:latest",
                                                    node_exporter_image=NODE_EXPORTER)}))
    result = CliRunner().invoke(app, ["plan", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if KEYS[0] in line]) == 1


def test_both_images_reach_the_node_settings_and_none_leaves_them_out() -> None:
    spec = parse_stack_config(both(), stack="t")
    m = group_metrics(spec.observability, spec.region)
    assert m is not None and m.containers and spec.observability.prometheus.containers
    assert (m.prometheus_image, m.node_exporter_image) == (PROMETHEUS, NODE_EXPORTER)
    plain = parse_stack_config(stack(), stack="t")
    m = group_metrics(plain.observability, plain.region)
    assert m is not None and not m.containers and (m.prometheus_image, m.node_exporter_image) == (None, None)


# ------------------------------------------------------------------- what the node gets


def files_of(config: dict[str, Any]) -> dict[str, str]:
    spec = parse_stack_config(config, stack="t")
    return {f.path: f.content for f in node_files(node_bootstrap(spec, spec.node_groups[0]))}


def test_the_node_gets_the_images_and_a_unit_that_serves_the_container() -> None:
    files = files_of(both())
    env = dict(line.split("=", 1) for line in files["/etc/gpucluster/metrics.env"].splitlines())
    assert (env["GPUCLUSTER_PROMETHEUS_IMAGE"], env["GPUCLUSTER_NODE_EXPORTER_IMAGE"]) == (
        PROMETHEUS, NODE_EXPORTER)
    unit = files["/etc/systemd/system/gpucluster-prometheus.service"]
    assert (f"ExecStart=/usr/local/sbin/gpucluster-metrics serve {PROMETHEUS_DATA} {PROMETHEUS_RETENTION}\n"
            in unit)
    assert "Requires=docker.service" in unit and "After=network-online.target docker.service" in unit
    assert "/usr/bin/prometheus" not in unit and "Restart=always" in unit


def test_without_the_images_the_node_files_are_what_they_were() -> None:
    files = files_of(stack())
    assert "IMAGE=quay.io" not in files["/etc/gpucluster/metrics.env"]
    assert "GPUCLUSTER_PROMETHEUS_IMAGE" not in files["/etc/gpucluster/metrics.env"]
    unit = files["/etc/systemd/system/gpucluster-prometheus.service"]
    assert unit == prometheus_unit(False)
    assert "ExecStart=/usr/bin/prometheus --config.file=/etc/gpucluster/prometheus.yml " in unit
    assert "docker" not in unit


# ------------------------------------------------------------------- metrics.sh start, both OS families


def run_start(tmp_path: Path, system: str, bodies: dict[str, str] | None = None,
              images: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], Path]:
    return run_metrics(tmp_path, "start", bodies=NO_BINARIES if bodies is None else bodies,
                       extra_env={**os_env(tmp_path / "os-under-test", system),
                                  **(IMAGES if images is None else images)})


@pytest.mark.parametrize("system", SYSTEMS)
def test_start_runs_the_pinned_containers_on_every_os_and_installs_nothing(tmp_path: Path,
                                                                           system: str) -> None:
    result, log = run_start(tmp_path, system)
    assert result.returncode == 0, result.stdout + result.stderr
    runs = [c for c in logged_calls(log, "docker") if c.startswith("run")]
    check, dcgm, node = runs
    # The config checked by the image's own promtool, read-only, before anything starts.
    assert check == (f"run --rm --network none --entrypoint /bin/promtool -v {tmp_path / 'prometheus.yml'}:"
                     f"/etc/prometheus/prometheus.yml:ro {PROMETHEUS} check config "
                     "/etc/prometheus/prometheus.yml")
    assert DIGEST in dcgm
    assert node == ("run -d --name gpucluster-node-exporter --restart unless-stopped --network host "
                    "--pid host "
                    f"-v /:/host:ro,rslave {NODE_EXPORTER} --path.rootfs=/host "
                    "--web.listen-address=127.0.0.1:9100")
    assert logged_calls(log, "systemctl") == ["enable --now gpucluster-prometheus"]
    for installer in ("apt-get", "dnf", "promtool"):
        assert logged_calls(log, installer) == [], installer


def test_the_containers_start_in_order_config_checked_first(tmp_path: Path) -> None:
    result, log = run_start(tmp_path, "al2023")
    assert result.returncode == 0
    lines = log.read_text().splitlines()
    order = [i for i, line in enumerate(lines) if line.startswith(("docker run", "systemctl enable"))]
    assert [lines[i].split()[0] for i in order] == ["docker", "docker", "docker", "systemctl"]


def test_a_config_the_images_promtool_refuses_starts_nothing(tmp_path: Path) -> None:
    bodies = {**NO_BINARIES, "docker": 'case "$*" in *promtool*) exit 1 ;; esac'}
    result, log = run_start(tmp_path, "al2023", bodies)
    assert result.returncode != 0
    assert [c for c in logged_calls(log, "docker") if c.startswith("run")] == [logged_calls(log, "docker")[0]]
    assert logged_calls(log, "systemctl") == []


def test_a_node_exporter_that_does_not_start_fails_the_step(tmp_path: Path) -> None:
    bodies = {**NO_BINARIES, "docker": 'case "$*" in *node-exporter*--path*) exit 125 ;; esac'}
    result, log = run_start(tmp_path, "ubuntu-22.04", bodies)
    assert result.returncode != 0 and logged_calls(log, "systemctl") == []


def test_docker_is_installed_first_where_the_ami_has_none(tmp_path: Path) -> None:
    if Path("/usr/bin/docker").exists() or Path("/bin/docker").exists():
        pytest.skip("this machine has Docker")
    install = tmp_path / "fake-install"
    install.write_text(f'#!/bin/bash\necho "gpucluster-install $*" >> {tmp_path / "calls.log"}\n')
    install.chmod(0o755)
    bodies = {k: v for k, v in NO_BINARIES.items() if k != "docker"}
    result, log = run_metrics(tmp_path, "start", bodies=bodies, extra_env={
        **os_env(tmp_path / "os-under-test", "al2023"), **IMAGES, "GPUCLUSTER_INSTALL": str(install)})
    assert log.read_text().splitlines()[-1] == "gpucluster-install container-runtime"  # before any docker
    assert result.returncode != 0  # the stub installed nothing


@pytest.mark.parametrize("system", SYSTEMS)
def test_half_set_images_take_the_package_path(tmp_path: Path, system: str) -> None:
    """The stack file refuses one without the other; a node given one anyway does not half-run containers."""
    _, log = run_start(tmp_path, system, images={"GPUCLUSTER_PROMETHEUS_IMAGE": PROMETHEUS})
    assert not [c for c in logged_calls(log, "docker") if "node-exporter" in c or "promtool" in c]
    assert (logged_calls(log, "apt-get") != []) == system.startswith("ubuntu")


def test_al2023_without_the_images_says_which_keys_in_one_line(tmp_path: Path) -> None:
    result, log = run_start(tmp_path, "al2023", {**NO_BINARIES, "dnf": ""}, images={})
    assert result.returncode == 1
    [line] = [x for x in result.stdout.splitlines() if "NOT STARTED" in x]
    assert line.startswith("gpucluster-metrics: NOT STARTED: no Prometheus package for this OS (al2023): ")
    for key in KEYS:
        assert key in line
    assert logged_calls(log, "docker") == [] and logged_calls(log, "dnf") == []


def test_ubuntu_without_the_images_keeps_apt(tmp_path: Path) -> None:
    result, log = run_start(tmp_path, "ubuntu-24.04", images={})
    assert result.returncode == 0, result.stderr
    assert logged_calls(log, "apt-get")[0].endswith("prometheus prometheus-node-exporter")
    assert "enable --now prometheus-node-exporter" in logged_calls(log, "systemctl")


# ------------------------------------------------------------------- serve: the unit's process


def serve_command(tmp_path: Path) -> list[str]:
    """The container unit's ExecStart, with gpucluster-metrics the shipped script under `tmp_path` and
    the data directory there."""
    [line] = [x for x in prometheus_unit(True).splitlines() if x.startswith("ExecStart=")]
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[:2] == ["/usr/local/sbin/gpucluster-metrics", "serve"]
    return ["bash", str(tmp_path / "metrics.sh"), "serve", str(tmp_path / "data"), *argv[3:]]


def test_the_units_serve_runs_prometheus_on_the_host_network_as_nobody(tmp_path: Path) -> None:
    result, log = run_metrics(tmp_path, "render", "i-0abc", "p5.48xlarge",
                              bodies={**START_STUBS, "install": ""}, extra_env=IMAGES)
    assert result.returncode == 0
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "GPUCLUSTER_NODE_ENV": str(tmp_path / "node.env"),
           "GPUCLUSTER_METRICS_ENV": str(tmp_path / "metrics.env"),
           "GPUCLUSTER_PROMETHEUS_CONFIG": str(tmp_path / "prometheus.yml"), **IMAGES}
    served = subprocess.run(serve_command(tmp_path), env=env, capture_output=True, text=True, timeout=30)
    assert served.returncode == 0, served.stderr
    data = tmp_path / "data"
    assert logged_calls(log, "install") == [f"-d -m 0750 -o 65534 -g 65534 {data}"]
    assert logged_calls(log, "docker") == [
        "rm -f gpucluster-prometheus",
        f"run --rm --name gpucluster-prometheus --network host --user 65534:65534 "
        f"-v {tmp_path / 'prometheus.yml'}:/etc/prometheus/prometheus.yml:ro -v {data}:/prometheus "
        f"{PROMETHEUS} "
        "--config.file=/etc/prometheus/prometheus.yml --storage.tsdb.path=/prometheus "
        f"--storage.tsdb.retention.time={PROMETHEUS_RETENTION} --web.listen-address=127.0.0.1:9090"]


def test_serve_without_an_image_is_a_usage_error(tmp_path: Path) -> None:
    result, log = run_metrics(tmp_path, "serve", "/tmp/none", "2h", bodies=START_STUBS)
    assert result.returncode == 2 and "no GPUCLUSTER_PROMETHEUS_IMAGE" in result.stderr
    assert logged_calls(log, "docker") == []


def test_the_shipped_script_ships_with_the_container_unit() -> None:
    spec = parse_stack_config(both(), stack="t")
    m = group_metrics(spec.observability, spec.region)
    assert m is not None
    paths = [f.path for f in metrics_files(m)]
    assert "/usr/local/sbin/gpucluster-metrics" in paths
    assert "/etc/systemd/system/gpucluster-prometheus.service" in paths



# ------------------------------------------------------------------- doctor on an Amazon Linux 2023 AMI


def al2023_findings(**prometheus: Any) -> list[Any]:
    from gpucluster.ops.doctor import check_amis
    from test_doctor_amis import AL2023, image, stubbed_ec2
    from test_doctor_amis import IMAGES as AMI_IMAGES
    config = stack(**prometheus)
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": AL2023}
    name, description, root = AMI_IMAGES["Amazon Linux 2023"]
    ec2, _ = stubbed_ec2((AL2023, image(AL2023, name, description, root)))
    return list(check_amis(parse_stack_config(config, stack="t"), ec2))


def test_doctor_warns_on_al2023_without_the_images_naming_both_keys() -> None:
    [warned] = [f for f in al2023_findings() if f.level == "warning"]
    assert warned.subject == "gpu" and "no Prometheus package" in warned.message
    for key in KEYS:
        assert key in warned.message


def test_doctor_does_not_warn_on_al2023_with_the_images() -> None:
    found = al2023_findings(prometheus_image=PROMETHEUS, node_exporter_image=NODE_EXPORTER)
    assert {f.level for f in found} == {"ok"}
