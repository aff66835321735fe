"""MIG partitions: the profile facts, the stack file's `mig` key, and the slots jobs see.

The facts (catalog/data/mig_profiles.yaml) come from NVIDIA's MIG user guide; the checks here pin
the ones a wrong copy would get wrong (instance limits, placements, which GPUs have MIG), and the
validation of a layout against them, one key path per error.
"""

from __future__ import annotations

import re
from itertools import combinations_with_replacement
from typing import Any

import pytest

from cli_text import joined_lines
from gpucluster import catalog
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError, stack_warnings

MIG_TYPES = {"p4d.24xlarge": "A100-40GB", "p4de.24xlarge": "A100-80GB", "p5.4xlarge": "H100-80GB",
             "p5.48xlarge": "H100-80GB", "p5e.48xlarge": "H200-141GB", "p5en.48xlarge": "H200-141GB",
             "p6-b200.48xlarge": "B200-180GB"}


# ---------------------------------------------------------------------------- catalog


def test_exactly_the_a100_h100_h200_b200_types_have_mig() -> None:
    found = {name: gpu.name for name in catalog.names() if (gpu := catalog.mig_gpu(name))}
    assert found == MIG_TYPES
    for name in catalog.names():
        if name not in MIG_TYPES:  # T4, A10G, L4, L40S: not in the guide's "Supported GPUs"
            assert catalog.get(name).gpu_model in {"T4", "A10G", "L4", "L40S"}  # type: ignore[union-attr]


@pytest.mark.parametrize(("gpu", "small", "seven"), [
    ("A100-40GB", "1g.5gb", "7g.40gb"), ("A100-80GB", "1g.10gb", "7g.80gb"),
    ("H100-80GB", "1g.10gb", "7g.80gb"), ("H200-141GB", "1g.18gb", "7g.141gb"),
    ("B200-180GB", "1g.23gb", "7g.180gb"),
])
def test_each_gpu_has_the_guides_profiles(gpu: str, small: str, seven: str) -> None:
    g = catalog.mig_gpus()[gpu]
    assert (g.compute_slices, g.memory_slices) == (7, 8)
    assert g.profiles[small].max_instances == 7 and g.profiles[small].placements == tuple(range(7))
    assert g.profiles[small + "+me"].max_instances == 1  # one media-extension instance per GPU
    assert (g.profiles[seven].compute_slices, g.profiles[seven].memory_slices) == (7, 8)
    # the guide's instance limits, by compute slices (2-slice 1g profiles: 4)
    limits = {(p.compute_slices, p.memory_slices): p.max_instances for p in g.profiles.values()
              if not p.name.endswith("+me")}
    assert limits == {(1, 1): 7, (1, 2): 4, (2, 2): 3, (3, 4): 2, (4, 4): 1, (7, 8): 1}


def test_profile_names_say_their_slices_and_memory() -> None:
    for g in catalog.mig_gpus().values():
        for name, p in g.profiles.items():
            match = re.fullmatch(r"(\d)g\.(\d+)gb(\+me)?", name)
            assert match, name
            assert (int(match[1]), int(match[2])) == (p.compute_slices, p.memory_gb), name
            # `nvidia-smi mig -lgipp`: every placement fits the 8 memory slices, and the limit
            # is never more than the non-overlapping placements allow
            assert all(s + p.memory_slices <= g.memory_slices for s in p.placements), name
            assert p.max_instances <= len({s // p.memory_slices for s in p.placements}), name


def test_source_names_the_guide_and_a_date() -> None:
    source, as_of = catalog.mig_source()
    assert "Multi-Instance GPU User Guide" in source and re.fullmatch(r"\d{4}-\d{2}-\d{2}", as_of)
    header = catalog.MIG_FILE.read_text().split("\ngpus:")[0]
    assert "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/" in header
    assert "Supported MIG Profiles" in header and "-lgipp" in header


@pytest.mark.parametrize(("layout", "placed"), [
    (["1g.10gb"] * 7, [("1g.10gb", i) for i in range(7)]),
    (["3g.40gb", "3g.40gb"], [("3g.40gb", 0), ("3g.40gb", 4)]),
    (["4g.40gb", "3g.40gb"], [("4g.40gb", 0), ("3g.40gb", 4)]),
    # a 3g instance first at 0 would leave the two 2g ones one place: it goes to 4
    (["2g.20gb", "3g.40gb", "2g.20gb"], [("3g.40gb", 4), ("2g.20gb", 0), ("2g.20gb", 2)]),
    # the guide's 3-2-1-1 geometry
    (["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"],
     [("3g.40gb", 4), ("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3)]),
    (["4g.40gb", "4g.40gb"], None),
    (["3g.40gb", "3g.40gb", "1g.10gb"], None),
    (["1g.20gb"] * 4 + ["1g.10gb"], None),
])
def test_placements_are_the_largest_first_and_never_overlap(layout: list[str], placed: Any) -> None:
    gpu = catalog.mig_gpus()["H100-80GB"]
    result = gpu.place(layout)
    assert (list(result) if result is not None else None) == placed


def test_every_layout_that_fits_gets_disjoint_placements() -> None:
    """All layouts of up to 7 instances on an H100: placed ones never share a memory slice."""
    gpu = catalog.mig_gpus()["H100-80GB"]
    names = [n for n in gpu.profiles if not n.endswith("+me")]
    fitting = 0
    for size in range(1, 8):
        for layout in combinations_with_replacement(names, size):
            placed = gpu.place(layout)
            if placed is None:
                continue
            fitting += 1
            slices = [s for name, start in placed
                      for s in range(start, start + gpu.profiles[name].memory_slices)]
            assert len(slices) == len(set(slices)) and max(slices) < 8, layout
            assert sum(gpu.profiles[n].compute_slices for n in layout) <= 7, layout
            assert sorted(n for n, _ in placed) == sorted(layout)
    assert fitting > 30


# ------------------------------------------------------------------------------ spec


def config_with(base_config: dict[str, Any], types: list[str], mig: Any, **autostop: Any) -> dict[str, Any]:
    """The base stack with one group of `types` and `mig`, in a zone that offers every type."""
    region = next(r for r in ("us-east-1", "us-west-2")
                  if all(catalog.offered_zones(t, r) for t in types))
    zone = sorted(set.intersection(*(set(catalog.offered_zones(t, region) or []) for t in types)))[0]
    base_config["aws:region"] = region
    base_config["gpucluster:network"]["availability_zones"] = [zone]
    base_config["gpucluster:node_groups"][0].update({"instance_types": types, "mig": mig, "efa": "off"})
    if autostop:
        base_config["gpucluster:autostop"] = autostop
    return base_config


@pytest.mark.parametrize(("types", "mig", "layout"), [
    (["p5.48xlarge"], {"profile": "1g.10gb", "count": 7}, ("1g.10gb",) * 7),
    (["p5.48xlarge"], {"profile": "1g.10gb"}, ("1g.10gb",) * 7),  # as many as fit
    (["p5.48xlarge"], {"profile": "3g.40gb"}, ("3g.40gb",) * 2),
    (["p4d.24xlarge"], {"profile": "1g.10gb"}, ("1g.10gb",) * 4),  # an A100-40GB's 1g.10gb: 4
    (["p4d.24xlarge", "p4de.24xlarge"], {"profile": "1g.10gb", "count": 4}, ("1g.10gb",) * 4),
    (["p5e.48xlarge"], {"profiles": ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]},
     ("3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb")),
    (["p6-b200.48xlarge"], {"profile": "7g.180gb"}, ("7g.180gb",)),
])
def test_valid_layouts(base_config: dict[str, Any], types: list[str], mig: Any,
                       layout: tuple[str, ...]) -> None:
    spec = parse_stack_config(config_with(base_config, types, mig), stack="t")
    group = spec.node_groups[0]
    assert group.mig_layout == layout
    assert group.slots_per_gpu == len(layout)


# (instance types, mig, key path, message fragment)
INVALID: list[tuple[list[str], Any, str, str]] = [
    (["g6e.12xlarge"], {"profile": "1g.10gb"}, "node_groups[0].instance_types[0]",
     "g6e.12xlarge has L40S GPUs, which have no MIG; a mig layout needs A100, H100, H200 or B200"),
    (["p5.48xlarge", "g5.12xlarge"], {"profile": "1g.10gb"}, "node_groups[0].instance_types[1]",
     "g5.12xlarge has A10G GPUs, which have no MIG"),
    (["g6.xlarge"], {"profiles": ["1g.10gb"]}, "node_groups[0].instance_types[0]", "L4 GPUs"),
    (["p5.48xlarge"], {"profile": "1g.5gb"}, "node_groups[0].mig.profile",
     "1g.5gb is not a MIG profile of p5.48xlarge's H100-80GB (it has 1g.10gb, 1g.10gb+me"),
    (["p4d.24xlarge"], {"profile": "1g.20gb"}, "node_groups[0].mig.profile",
     "1g.20gb is not a MIG profile of p4d.24xlarge's A100-40GB"),
    (["p5.48xlarge"], {"profile": "1g.10gb", "count": 8}, "node_groups[0].mig.count", "must be 1..7, got 8"),
    (["p5.48xlarge"], {"profile": "1g.20gb", "count": 5}, "node_groups[0].mig.count",
     "one H100-80GB (p5.48xlarge) holds at most 4 x 1g.20gb, got 5"),
    (["p5.48xlarge"], {"profiles": ["3g.40gb"] * 3}, "node_groups[0].mig.profiles",
     "holds at most 2 x 3g.40gb, got 3"),
    (["p5.48xlarge"], {"profiles": ["1g.10gb+me", "1g.10gb+me"]}, "node_groups[0].mig.profiles",
     "holds at most 1 x 1g.10gb+me, got 2"),
    (["p5.48xlarge"], {"profiles": ["4g.40gb", "2g.20gb", "2g.20gb"]}, "node_groups[0].mig.profiles",
     "4g.40gb, 2g.20gb, 2g.20gb do not fit one H100-80GB (p5.48xlarge): they need 8 of its 7 compute slices"),
    (["p5.48xlarge"], {"profiles": ["3g.40gb", "1g.20gb", "1g.20gb", "1g.10gb"]},
     "node_groups[0].mig.profiles", "they need 9 of its 8 memory slices"),
    (["p4d.24xlarge", "p4de.24xlarge"], {"profile": "1g.10gb"}, "node_groups[0].mig.count",
     "required here: the group's types fit different numbers of 1g.10gb per GPU (p4d.24xlarge: 4, "
     "p4de.24xlarge: 7)"),
    (["p5.48xlarge"], {}, "node_groups[0].mig", "set profile (with an optional count) or profiles"),
    (["p5.48xlarge"], {"profile": "1g.10gb", "profiles": ["1g.10gb"]}, "node_groups[0].mig", "not both"),
    (["p5.48xlarge"], {"profiles": ["1g.10gb"], "count": 2}, "node_groups[0].mig.count",
     "only used with profile"),
    (["p5.48xlarge"], {"profiles": []}, "node_groups[0].mig.profiles", "needs at least 1 item"),
    (["p5.48xlarge"], {"profile": "1G.10GB"}, "node_groups[0].mig.profile",
     "must be a MIG profile name like 1g.10gb"),
    (["p5.48xlarge"], {"profle": "1g.10gb"}, "node_groups[0].mig.profle", "did you mean 'profile'"),
    (["p5.48xlarge"], "1g.10gb", "node_groups[0].mig", "must be a mapping of keys"),
]


@pytest.mark.parametrize(("types", "mig", "path", "message"), INVALID,
                         ids=[f"{i}-{case[2]}" for i, case in enumerate(INVALID)])
def test_invalid_layouts_name_the_key_path(base_config: dict[str, Any], types: list[str], mig: Any,
                                           path: str, message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_stack_config(config_with(base_config, types, mig), stack="t")
    lines = str(err.value).splitlines()
    assert any(line.startswith(f"{path}: ") and message in line for line in lines), lines
    assert all(len(line) <= 200 for line in lines)


def test_the_cli_refuses_a_mig_layout_on_a_gpu_without_mig(base_config: dict[str, Any],
                                                           tmp_path: Any) -> None:
    import yaml
    from typer.testing import CliRunner

    from gpucluster.cli import app

    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / "Pulumi.t.yaml").write_text(yaml.safe_dump(
        {"config": config_with(base_config, ["g5.xlarge"], {"profile": "1g.10gb"})}))
    result = CliRunner().invoke(app, ["--stacks-dir", str(stacks), "plan", "t"])
    assert result.exit_code == 2
    assert "node_groups[0].instance_types[0]: g5.xlarge has A10G GPUs, which have no MIG" in result.output
    assert "Traceback" not in result.output


def test_idle_stop_warns_that_mig_gpus_report_no_utilisation(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(config_with(base_config, ["p5.48xlarge"], {"profile": "1g.10gb"},
                                          idle_minutes=30), stack="t")
    warnings = [f for f in stack_warnings(spec) if f.path == "node_groups[0].mig"]
    assert len(warnings) == 1 and "report no utilisation" in warnings[0].message
    base_config["gpucluster:autostop"] = {"enabled": False}
    quiet = parse_stack_config(base_config, stack="t")
    assert not [f for f in stack_warnings(quiet) if f.path == "node_groups[0].mig"]


def test_groups_without_mig_see_whole_gpus(base_config: dict[str, Any]) -> None:
    group = parse_stack_config(base_config, stack="t").node_groups[0]
    assert group.mig_layout == () and group.slots_per_gpu == 1


# -------------------------------------------------------------- slots: nodes, hostfile, run


def mig_node(instance_id: str, ip: str, minute: int, mig_per_gpu: int = 7) -> Any:
    from datetime import UTC, datetime, timedelta

    from gpucluster.ops.nodes import Node

    launched = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minute)
    return Node(instance_id, "infer", "asg", "p5.48xlarge", "us-east-1a", ip, "on-demand", "running",
                "InService", "Healthy", launched, "Online", mig_per_gpu=mig_per_gpu)


def test_mig_devices_are_slots_and_one_rank_each() -> None:
    """torchrun's ranks: NODE_RANK * NPROC_PER_NODE + LOCAL_RANK, LOCAL_RANK i on the node's i-th
    MIG device (`gpucluster-mig exec`, tested in test_node_mig.py)."""
    from gpucluster.ops.run import plan_job

    nodes = [mig_node("i-0a", "10.0.0.5", 0), mig_node("i-0b", "10.0.0.6", 1)]
    assert [(n.gpus, n.slots) for n in nodes] == [(8, 56), (8, 56)]
    plan = plan_job(nodes, "torchrun --nproc-per-node=$NPROC_PER_NODE --no-python gpucluster-mig exec "
                           "python serve.py", log_group="/x")
    env = [r.environment for r in plan.ranks]
    assert [e["NPROC_PER_NODE"] for e in env] == ["56", "56"] and env[0]["WORLD_SIZE"] == "112"
    assert [e["NODE_RANK"] for e in env] == ["0", "1"]
    whole = plan_job([mig_node("i-0c", "10.0.0.7", 0, mig_per_gpu=0)], "true", log_group="/x")
    assert whole.ranks[0].environment["NPROC_PER_NODE"] == "8"  # no MIG: the GPUs


@pytest.fixture
def mig_stack(tmp_path: Any, base_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> Any:
    """A stack file with a MIG group `infer` (p5.48xlarge, 3g.40gb + 2 x 2g.20gb per GPU), and its
    two nodes launched by a moto Auto Scaling group tagged with the stack's identity."""
    import boto3
    import yaml
    from moto import mock_aws

    from gpucluster.ops import nodes as ops_nodes
    from gpucluster.plan import load_stack
    from moto_groups import create_stack_groups, tag_node_group

    base_config["gpucluster:node_groups"] = [
        {"name": "infer", "instance_types": ["p5.48xlarge"], "max_nodes": 2, "efa": "off",
         "availability_zones": ["us-east-1a"],
         "mig": {"profiles": ["3g.40gb", "2g.20gb", "2g.20gb"]}}]
    path = tmp_path / "Pulumi.mig.yaml"
    path.write_text(yaml.safe_dump({"config": base_config}))
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr(ops_nodes, "ssm_ping", lambda _ssm, ids: dict.fromkeys(ids, "Online"))
    with mock_aws():
        ec2 = boto3.client("ec2")
        ec2.create_launch_template(LaunchTemplateName="mig-nodes", LaunchTemplateData={
            "ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge"})
        autoscaling = boto3.client("autoscaling")
        create_stack_groups(autoscaling, {"mig-infer": (load_stack(str(path))[2].identity, 0, 2, 2)},
                            launch_template="mig-nodes")
        tag_node_group(autoscaling, "mig-infer", "infer")
        yield path


def test_cli_nodes_and_hostfile_count_mig_devices(mig_stack: Any) -> None:
    import json

    from typer.testing import CliRunner

    from gpucluster.cli import app

    runner = CliRunner()
    listed = json.loads(runner.invoke(app, ["nodes", str(mig_stack), "--json"]).stdout)["nodes"]
    assert [(n["gpus"], n["mig_per_gpu"], n["slots"]) for n in listed] == [(8, 3, 24), (8, 3, 24)]
    table = joined_lines(runner.invoke(app, ["nodes", str(mig_stack)]).output)  # rows folded at 100 columns
    assert table[1].split()[3:6] == ["type", "GPUs", "slots"]
    assert all(row.split()[2:6] == ["p5.48xlarge", "8", "24", "MIG"] for row in table[2:])
    hosts = runner.invoke(app, ["hostfile", str(mig_stack), "--group", "infer"])
    assert hosts.exit_code == 0, hosts.output
    assert [line.split()[1] for line in hosts.output.splitlines()] == ["slots=24", "slots=24"]
    assert [line.split()[0] for line in hosts.output.splitlines()] == [n["private_ip"] for n in listed]


def test_cli_run_dry_run_gives_one_process_per_mig_device(mig_stack: Any) -> None:
    from typer.testing import CliRunner

    from gpucluster.cli import app

    result = CliRunner().invoke(app, ["run", str(mig_stack), "--group", "infer", "--dry-run", "--",
                                      "torchrun --nproc-per-node=$NPROC_PER_NODE --no-python "
                                      "gpucluster-mig exec python serve.py"])
    assert result.exit_code == 0, result.output
    exports = [line.strip() for line in result.output.splitlines() if line.startswith("  export ")]
    assert exports.count("export NPROC_PER_NODE=24") == 2 and exports.count("export WORLD_SIZE=48") == 2
    assert exports.count("export GPUCLUSTER_MIG_LAYOUT=3g.40gb,2g.20gb,2g.20gb") == 2


def test_a_mig_group_plans_and_its_nodes_boot_with_the_layout(base_config: dict[str, Any]) -> None:
    import base64
    import gzip

    from base_config import plan_config

    plan = plan_config(config_with(base_config, ["p5.48xlarge"], {"profile": "3g.40gb"}))
    [template] = plan.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    user_data = gzip.decompress(base64.b64decode(template.inputs["userData"])).decode()
    assert "GPUCLUSTER_MIG_LAYOUTS='*=3g.40gb:0,3g.40gb:4'" in user_data
    # from the node scripts bundle the user data fetches and verifies first
    assert ("install -m 0755 /usr/local/lib/gpucluster/scripts/mig.sh /usr/local/sbin/gpucluster-mig\n"
            in user_data)


def test_the_mig_guides_profile_table_is_the_catalogs() -> None:
    from pathlib import Path

    readme = (Path(__file__).parent.parent / "docs" / "guides" / "mig.md").read_text()
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in readme.splitlines()
            if re.match(r"\| (A100|H100|H200|B200)-\d+GB \|", line)}
    assert rows == {name: ", ".join(f"{p} ({q.max_instances})" for p, q in gpu.profiles.items())
                    for name, gpu in catalog.mig_gpus().items()}
