"""benchmarks/boot_time.py: the modelled boot budget (issue 26's target: baked prod ready in < 4 min)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucluster.node.userdata import node_bootstrap
from gpucluster.preflight import parse_stack_config

SCRIPT = Path(__file__).parent.parent / "benchmarks/boot_time.py"


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("boot_time", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


boot_time = _module()


def test_baked_prod_is_ready_in_under_four_minutes_and_downloads_only_its_node_scripts() -> None:
    boots = {(b.stack, b.group): b for b in boot_time.boots()}
    baked = boots["prod (baked)", "h100-train"]
    assert baked.ready_seconds < boot_time.TARGET_SECONDS
    # nothing installed or pulled: the one download is the node scripts bundle (every node fetches it)
    from gpucluster.node.bundle import bundle_bytes
    assert [(s.name, s.downloads) for s in baked.steps if s.downloads != "-"] == [
        ("fetch + verify the node scripts bundle", f"{len(bundle_bytes()) / 1000:.0f} KB")]
    assert all(any(s.name == "fetch + verify the node scripts bundle" for s in b.steps)
               for b in boots.values())
    unbaked = boots["prod", "h100-train"]
    assert unbaked.critical_branch == "image" and unbaked.ready_seconds > 300
    assert unbaked.in_service_seconds < unbaked.ready_seconds  # InService before the image is there
    assert baked.in_service_seconds == baked.ready_seconds  # gated: in service means ready
    before = boots["prod (before: dpkg lock held)", "h100-train"]
    assert before.ready_seconds > unbaked.ready_seconds
    assert boot_time.main([]) == 0


def test_a_group_that_adds_boot_work_shows_it() -> None:
    config = boot_time.stack_config("dev")
    spec = parse_stack_config(config, stack="dev")
    plain = boot_time.boot_steps("dev", node_bootstrap(spec, spec.node_groups[0]))
    config["gpucluster:node_groups"][0]["container_image"] = "nvcr.io/nvidia/pytorch:24.12-py3"
    spec = parse_stack_config(config, stack="dev")
    pulled = boot_time.boot_steps("dev", node_bootstrap(spec, spec.node_groups[0]))
    assert pulled.ready_seconds > plain.ready_seconds
    assert any(s.name.startswith("docker pull") and s.downloads == "10000 MB" for s in pulled.steps)


def test_every_figure_names_its_source() -> None:
    for key, (value, source) in boot_time.FIGURES.items():
        assert value > 0 and len(source) > 10, key


def test_measured_milestones_print_beside_the_modelled_ones(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "boot_measurements.yaml"
    table.write_text("source: measured in an account on 2026-12-01 (gpucluster nodes prod --json)\n"
                     "boots:\n  - {stack: prod (baked), group: h100-train, first_job: 262,\n"
                     "     steps: {userdata: 151, bundle: 153, ready: 252}, nodes: 4}\n")
    assert boot_time.main(["--measurements", str(table)]) == 0
    out = capsys.readouterr().out
    assert "prod (baked) / h100-train     userdata  measured 2m31s  modelled 2m15s" in out
    assert "ready     measured 4m12s  modelled 3m43s" in out and "first_job measured 4m22s" in out
    assert "(measured in an account on 2026-12-01 (gpucluster nodes prod --json))" in out
    assert "still modelled only: dev / " in out  # every other group
    rows = boot_time.compared(boot_time.boots(), boot_time.measurements(table))
    baked = {r["milestone"]: r for r in rows if (r["stack"], r["group"]) == ("prod (baked)", "h100-train")}
    assert baked["image"]["measured_seconds"] is None and baked["image"]["modelled_seconds"] > 0
    # without a table every figure is modelled, and the output says so
    assert boot_time.main(["--measurements", str(tmp_path / "absent.yaml")]) == 0
    assert "measured: none (" in capsys.readouterr().out and boot_time.measurements(tmp_path / "x") == {}


def test_the_model_gives_a_p5_its_lazily_loaded_first_boot_and_reads_a_baked_images_layers() -> None:
    assert 90 <= boot_time.figure("os_boot_s") <= 180
    boots = {(b.stack, b.group): b for b in boot_time.boots()}
    baked = boots["prod (baked)", "h100-train"]
    [read] = [s for s in baked.steps if s.name.startswith("read its layers")]
    assert read.seconds == pytest.approx(10_000 / (300 * 1.048576)) and "300 MiB/s" in read.source
    spec = parse_stack_config(boot_time.baked_prod_config(), stack="prod")
    lazy = boot_time.boot_steps("prod", node_bootstrap(spec, spec.node_groups[0]), volume_mibps=0)
    assert lazy.ready_seconds - baked.ready_seconds > 200  # ~10 GB at ~33 MB/s instead of 300 MiB/s
    assert baked.first_job_seconds > baked.ready_seconds
