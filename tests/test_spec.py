"""Stack config validation: every bad input names its key path and exits 2 through the CLI."""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import takewhile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpucluster.cli import app
from gpucluster.plan import load_stack
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError, stack_warnings

runner = CliRunner()
DELETE = object()


def mutate(config: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set (or with DELETE remove) `gpucluster:node_groups.0.capacity.spot_percent`-style paths."""
    *parents, last = path.split(".")
    node: Any = config
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    key: Any = int(last) if isinstance(node, list) else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return config


NG = "gpucluster:node_groups.0"
EFA_GROUP = {"name": "train", "instance_types": ["p5.48xlarge"], "min_nodes": 2, "desired_nodes": 2,
             "max_nodes": 4}

# (what to change, value, expected key path in the error, expected message fragment)
INVALID: list[tuple[str, Any, str, str]] = [
    ("aws:region", DELETE, "aws:region", "required"),
    ("aws:region", "mars-1", "aws:region", "must be a region"),
    ("gpucluster:clustr", {}, "gpucluster:clustr", "did you mean 'gpucluster:cluster'"),
    ("gpucluster:cluster", DELETE, "cluster", "required"),
    ("gpucluster:cluster.name", "Bad_Name", "cluster.name", "a-z, 0-9"),
    ("gpucluster:cluster.nmae", "x", "cluster.nmae", "did you mean 'name'"),
    ("gpucluster:cluster.tags.owner", DELETE, "cluster.tags.owner", "required"),
    ("gpucluster:cluster.tags.cost_center", DELETE, "cluster.tags.cost_center", "required"),
    ("gpucluster:cluster.tags.environment", "Prod!", "cluster.tags.environment", "lowercase"),
    ("gpucluster:cluster.tags.costcenter", "x", "cluster.tags.costcenter", "did you mean 'cost_center'"),
    ("gpucluster:cluster.extra_tags", {"aws:team": "x"}, "cluster.extra_tags.aws:team", "aws:"),
    ("gpucluster:cluster.extra_tags", {"AWS:team": "x"}, "cluster.extra_tags.AWS:team", "reserved"),
    # The stop-state and identity tags are the guardrails' own: a user's would forge them.
    ("gpucluster:cluster.extra_tags", {"gpucluster:stopped-by": "schedule"},
     "cluster.extra_tags.gpucluster:stopped-by", "tag key 'gpucluster:stopped-by' is reserved"),
    ("gpucluster:cluster.extra_tags", {"gpucluster:stack": "other-team"},
     "cluster.extra_tags.gpucluster:stack", "reserved"),
    ("gpucluster:network.availability_zones", [], "network.availability_zones", "at least 1"),
    ("gpucluster:network.availability_zones", ["us-west-2a"], "network.availability_zones[0]",
     "not a zone of region"),
    ("gpucluster:network.availability_zones", ["use1-az1"], "network.availability_zones[0]",
     "availability zone name"),
    ("gpucluster:network.vpc_cidr", "10.0.0.0/8", "network.vpc_cidr", "/16../22"),
    ("gpucluster:network.vpc_cidr", "10.0.0.1/16", "network.vpc_cidr", "not an IPv4 CIDR"),
    ("gpucluster:network.vpc_cidr", "8.8.0.0/16", "network.vpc_cidr", "private range"),
    ("gpucluster:network.vpc_cidr", DELETE, "network", "exactly one of vpc_cidr"),
    ("gpucluster:network.existing_vpc_id", "vpc-0123456789abcdef0", "network", "exactly one of"),
    ("gpucluster:network.existing_subnets", {"us-east-1a": "subnet-0123456789abcdef0"},
     "network.existing_subnets", "only used with existing_vpc_id"),
    ("gpucluster:network.nat_gateway", "maybe", "network.nat_gateway", "true or false"),
    ("gpucluster:node_groups", [], "node_groups", "at least 1"),
    (f"{NG}.instance_types", ["p5.48xlarg"], "node_groups[0].instance_types[0]",
     "did you mean 'p5.48xlarge'"),
    (f"{NG}.instance_types", [], "node_groups[0].instance_types", "at least 1"),
    (f"{NG}.instance_types", ["g5.xlarge", "g5.xlarge"], "node_groups[0].instance_types", "unique"),
    (f"{NG}.min_nodes", 3, "node_groups[0]", "min_nodes <= desired_nodes <= max_nodes"),
    (f"{NG}.desired_nodes", 5, "node_groups[0]", "min_nodes <= desired_nodes <= max_nodes"),
    (f"{NG}.max_nodes", 0, "node_groups[0].max_nodes", "must be 1..2000, got 0"),
    (f"{NG}.max_nodes", "lots", "node_groups[0].max_nodes", "whole number"),
    (f"{NG}.max_nodes", DELETE, "node_groups[0].max_nodes", "required"),
    (f"{NG}.capacity.spot_percent", 140, "node_groups[0].capacity.spot_percent", "must be 0..100, got 140"),
    (f"{NG}.capacity.spot_percent", -1, "node_groups[0].capacity.spot_percent", "must be 0..100, got -1"),
    (f"{NG}.capacity.spot_percent", 33.5, "node_groups[0].capacity.spot_percent",
     "whole percent; use a whole number, got 33.5"),
    (f"{NG}.capacity.on_demand_base", 5, "node_groups[0].capacity.on_demand_base", "<= max_nodes"),
    (f"{NG}.capacity.spot_allocation_strategy", "cheapest",
     "node_groups[0].capacity.spot_allocation_strategy", "must be one of"),
    (f"{NG}.capacity.market", "capacity_block", "node_groups[0].capacity.capacity_reservation_id",
     "needs its reservation id"),
    (f"{NG}.capacity.capacity_reservation_id", "res-123",
     "node_groups[0].capacity.capacity_reservation_id", "cr-"),
    (f"{NG}.capacity.base_commitment", "savings_plan", "node_groups[0].capacity.base_commitment",
     "on_demand_base is 0"),
    (f"{NG}.capacity.spotpercent", 10, "node_groups[0].capacity.spotpercent", "did you mean 'spot_percent'"),
    (f"{NG}.efa", "yes", "node_groups[0].efa", "must be one of"),
    (f"{NG}.efa", "on", "node_groups[0].instance_types[0]", "does not support EFA"),
    (f"{NG}.scratch_mount", "scratch", "node_groups[0].scratch_mount", "absolute path"),
    (f"{NG}.scratch_mount", "/etc", "node_groups[0].scratch_mount", "data roots /data, /fsx, /scratch, /mnt"),
    (f"{NG}.root_volume_size_gib", 10, "node_groups[0].root_volume_size_gib", "50..16384"),
    (f"{NG}.ami_id", "ubuntu", "node_groups[0].ami_id", "AMI id"),
    (f"{NG}.availability_zones", ["us-east-1c"], "node_groups[0].availability_zones[0]",
     "not in network.availability_zones"),
    (NG, {"name": "pg", "instance_types": ["g5.xlarge"], "max_nodes": 2, "placement_group": True,
          "availability_zones": ["us-east-1a", "us-east-1b"]},
     "node_groups[0].placement_group", "one availability zone"),
    ("gpucluster:datasets", [{"name": "data", "bucket_name": "My_Bucket"}], "datasets[0].bucket_name",
     "not a valid S3 bucket name"),
    ("gpucluster:datasets", [{"name": "data", "bucket_name": "192.168.1.1"}], "datasets[0].bucket_name",
     "IP address"),
    ("gpucluster:datasets", [{"name": "data", "existing": True}], "datasets[0].bucket_name",
     "required for an existing bucket"),
    ("gpucluster:datasets", [{"name": "data", "prefix": "/corpus/"}], "datasets[0].prefix",
     "do not start with '/'"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx"}], "datasets[0].fsx",
     "required when access is fsx"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx", "fsx": {"storage_capacity_gib": 3000}}],
     "datasets[0].fsx.storage_capacity_gib", "multiple of 2400"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx",
                              "fsx": {"deployment_type": "PERSISTENT_2"}}],
     "datasets[0].fsx.throughput_per_unit_mib", "required for PERSISTENT_2"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx",
                              "fsx": {"availability_zone": "us-east-1c"}}],
     "datasets[0].fsx.availability_zone", "no node group runs in"),
    ("gpucluster:datasets", [{"name": "data", "prefix": "corpus/", "checkpoint_prefix": "corpus/ckpt/"}],
     "datasets[0].checkpoint_prefix", "must not overlap"),
    ("gpucluster:datasets", [{"name": "data", "bucket_name": "ab"}], "datasets[0].bucket_name",
     "3-63 characters"),
    ("gpucluster:datasets", [{"name": "data", "bucket_name": "my..bucket"}], "datasets[0].bucket_name",
     "adjacent periods"),
    ("gpucluster:datasets", [{"name": "data", "bucket_name": "xn--bucket"}], "datasets[0].bucket_name",
     "not starting with xn--"),
    ("gpucluster:datasets", [{"name": "data", "bucket_name": "corpus-s3alias"}], "datasets[0].bucket_name",
     "reserved suffix"),
    ("gpucluster:datasets", [{"name": "data", "bucket_name": "corpus-a"}, {"name": "more",
                             "bucket_name": "corpus-a", "existing": True}],
     "datasets[1].bucket_name", "used twice"),
    ("gpucluster:datasets", [{"name": "data"}, {"name": "data"}], "datasets[1].name", "duplicate dataset"),
    ("gpucluster:datasets", [{"name": "data", "access": "rsync"}], "datasets[0].access", "must be one of"),
    ("gpucluster:datasets", [{"name": "data", "checkpoint_prefix": ""}], "datasets[0].checkpoint_prefix",
     "not the whole bucket"),
    ("gpucluster:datasets", [{"name": "data", "checkpoint_prefix": "ckpt"}], "datasets[0].checkpoint_prefix",
     "must end with '/'"),
    ("gpucluster:datasets", [{"name": "data", "bucket_name": "corpus-a", "existing": True,
                              "noncurrent_version_expiration_days": 7}],
     "datasets[0].noncurrent_version_expiration_days", "existing bucket's lifecycle is never changed"),
    ("gpucluster:datasets", [{"name": "data", "noncurrent_version_expiration_days": 7}],
     "datasets[0].noncurrent_version_expiration_days", "only used with a checkpoint_prefix"),
    ("gpucluster:datasets", [{"name": "data", "checkpoint_prefix": "ckpt/",
                              "noncurrent_version_expiration_days": 0}],
     "datasets[0].noncurrent_version_expiration_days", "must be 1..3650, got 0"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx", "fsx": {"storage_capacity_gib": 600}}],
     "datasets[0].fsx.storage_capacity_gib", "must be 1200..1200000, got 600"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx", "fsx": {"storage_capacity_gib": 4800,
                                                                     "throughput_per_unit_mib": 200}}],
     "datasets[0].fsx.throughput_per_unit_mib", "must be one of"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx", "fsx": {"throughput_per_unit_mib": 250}}],
     "datasets[0].fsx.throughput_per_unit_mib", "SCRATCH_2 has a fixed throughput"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx", "fsx": {"deployment_type": "SCRATCH_1"}}],
     "datasets[0].fsx.deployment_type", "must be one of"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx", "fsx": {"availability_zone": "use1-az1"}}],
     "datasets[0].fsx.availability_zone", "availability zone name"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx", "fsx": {}, "checkpoint_prefix": "ckpt/"}],
     "datasets[0].prefix", "data repository associations do not overlap"),
    ("gpucluster:datasets", [{"name": "data", "access": "mount", "fsx": {}}], "datasets[0].fsx",
     "only used with access: fsx"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx", "fsx": {}, "mount_path": "/data/x"}],
     "datasets[0].mount_path", "only used with access: mount"),
    ("gpucluster:datasets", [{"name": "data", "mount_path": "/scratch/data"}], "datasets[0].mount_path",
     "overlaps the NVMe scratch mount"),
    ("gpucluster:datasets", [{"name": "data", "access": "fsx", "fsx": {}},
                             {"name": "more", "access": "fsx", "fsx": {}}],
     "datasets[1].fsx.mount_path", "overlaps /fsx of dataset 'data'"),
    ("gpucluster:datasets", [{"name": "data", "mount_path": "/data"}, {"name": "more"}],
     "datasets[1].mount_path", "overlaps /data of dataset 'data'"),
    ("gpucluster:budget", {"monthly_limit_usd": 0}, "budget.monthly_limit_usd", "must be 1..10000000"),
    ("gpucluster:budget", {"monthly_limit_usd": 100, "alert_thresholds_percent": [80, 50]},
     "budget.alert_thresholds_percent", "strictly ascending"),
    ("gpucluster:budget", {"monthly_limit_usd": 100, "emails": ["not-an-email"]}, "budget.emails[0]",
     "e-mail"),
    ("gpucluster:budget", {"monthly_limit_usd": 100, "action_threshold_percent": 0},
     "budget.action_threshold_percent", "1..1000"),
    ("gpucluster:autostop", {"idle_minutes": 2}, "autostop.idle_minutes", "must be 5..1440, got 2"),
    ("gpucluster:autostop", {"gpu_utilization_threshold_percent": 0},
     "autostop.gpu_utilization_threshold_percent", "1..100"),
    ("gpucluster:autostop", {"stop_schedule": "0 20 * * *"}, "autostop.stop_schedule",
     "EventBridge cron"),
    ("gpucluster:autostop", {"stop_schedule": "cron(0 25 ? * * *)"}, "autostop.stop_schedule",
     "invalid hours field"),
    ("gpucluster:autostop", {"stop_schedule": "cron(0 20 * * MON *)"}, "autostop.stop_schedule",
     "exactly one of day-of-month and day-of-week"),
    ("gpucluster:autostop", {"start_schedule": "cron(0 8 ? * MON-FRI *)"}, "autostop.start_schedule",
     "needs a stop_schedule"),
    ("gpucluster:autostop", {"schedule_timezone": "Mars/Olympus"}, "autostop.schedule_timezone",
     "time zone"),
    ("gpucluster:autostop", {"pre_stop_timeout_seconds": 3600}, "autostop.pre_stop_timeout_seconds",
     "10..840"),
    ("gpucluster:autostop", {"idle_minute": 30}, "autostop.idle_minute", "did you mean 'idle_minutes'"),
    ("gpucluster:spot", {"interruption_timeout_seconds": 300}, "spot.interruption_timeout_seconds",
     "5..110"),
    ("gpucluster:spot", {"interruption_command": ""}, "spot.interruption_command", "non-empty"),
    ("gpucluster:autostop", {"pre_stop_command": "x" * 2049}, "autostop.pre_stop_command",
     "at most 2048 bytes"),
    ("gpucluster:budget", {"monthly_limit_usd": 100, "alert_thresholds_percent": list(range(10, 100, 10)),
                           "action_threshold_percent": 120},
     "budget.alert_thresholds_percent", "10 notifications per budget: 10 actual-spend thresholds"),
]


def test_table_is_large_enough() -> None:
    assert len(INVALID) >= 40


@pytest.mark.parametrize(("path", "value", "key_path", "fragment"), INVALID,
                         ids=[f"{i:02d}-{c[2]}" for i, c in enumerate(INVALID)])
def test_invalid_config_exits_2_naming_the_key(
    base_config: dict[str, Any], write_stack: Callable[..., Path],
    path: str, value: Any, key_path: str, fragment: str,
) -> None:
    stack = write_stack(mutate(base_config, path, value))
    result = runner.invoke(app, ["plan", str(stack)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith(f"{key_path}: ")]
    assert lines, f"no line for {key_path!r} in:\n{result.output}"
    assert any(fragment in line for line in lines), result.output
    assert "Traceback" not in result.output


def test_every_problem_is_reported_at_once(base_config: dict[str, Any]) -> None:
    mutate(base_config, f"{NG}.capacity.spot_percent", 140)
    mutate(base_config, "gpucluster:cluster.name", "X")
    mutate(base_config, "gpucluster:budgett", {})
    with pytest.raises(SpecError) as err:
        parse_stack_config(base_config, stack="t")
    assert {f.path for f in err.value.findings} == {
        "node_groups[0].capacity.spot_percent", "cluster.name", "gpucluster:budgett"}


def test_cross_field_problems_are_reported_together(base_config: dict[str, Any]) -> None:
    mutate(base_config, f"{NG}.min_nodes", 3)
    mutate(base_config, f"{NG}.efa", "on")
    mutate(base_config, "gpucluster:budget", {"monthly_limit_usd": 5, "alert_thresholds_percent": [9, 3]})
    with pytest.raises(SpecError) as err:
        parse_stack_config(base_config, stack="t")
    paths = [f.path for f in err.value.findings]
    assert "node_groups[0]" in paths
    assert "budget.alert_thresholds_percent" in paths
    assert "node_groups[0].instance_types[0]" in paths


def efa_config(base: dict[str, Any], **group: Any) -> dict[str, Any]:
    base["gpucluster:node_groups"] = [{**EFA_GROUP, **group}]
    return base


def test_efa_auto_resolves_on_for_multi_node_efa_types(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(efa_config(base_config), stack="t")
    group = spec.node_groups[0]
    assert group.efa_enabled and group.uses_placement_group
    assert spec.azs_of(group) == ["us-east-1a"]  # EFA: the network's first zone only


def test_efa_auto_is_off_for_single_node_groups_and_non_efa_types(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(efa_config(base_config, min_nodes=1, desired_nodes=1, max_nodes=1),
                              stack="t")
    assert not spec.node_groups[0].efa_enabled
    spec = parse_stack_config(base_config | {"gpucluster:node_groups": [
        {"name": "mix", "instance_types": ["g6e.48xlarge", "g5.xlarge"], "max_nodes": 4}]}, stack="t")
    assert not spec.node_groups[0].efa_enabled
    assert spec.azs_of(spec.node_groups[0]) == ["us-east-1a", "us-east-1b"]


def test_efa_group_in_two_zones_is_rejected(base_config: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match=r"node_groups\[0\].availability_zones: EFA needs exactly one"):
        parse_stack_config(efa_config(base_config, availability_zones=["us-east-1a", "us-east-1b"]),
                           stack="t")


def test_efa_types_must_share_nic_layout(base_config: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match="same network cards"):
        parse_stack_config(efa_config(base_config, instance_types=["p5.48xlarge", "p5en.48xlarge"]),
                           stack="t")
    spec = parse_stack_config(efa_config(base_config, instance_types=["p5.48xlarge", "p5e.48xlarge"]),
                              stack="t")
    assert spec.node_groups[0].efa_enabled


def test_capacity_block_rules(base_config: dict[str, Any]) -> None:
    efa_config(base_config, instance_types=["g6e.48xlarge"],
               capacity={"market": "capacity_block", "capacity_reservation_id": "cr-0123456789abcdef0",
                         "spot_percent": 50})
    with pytest.raises(SpecError) as err:
        parse_stack_config(base_config, stack="t")
    messages = str(err.value)
    assert "node_groups[0].capacity.spot_percent: capacity blocks have no spot share" in messages
    assert "g6e.48xlarge cannot be bought as a Capacity Block" in messages


def test_valid_capacity_block(base_config: dict[str, Any]) -> None:
    efa_config(base_config, capacity={"market": "capacity_block",
                                      "capacity_reservation_id": "cr-0123456789abcdef0"})
    spec = parse_stack_config(base_config, stack="t")
    assert spec.node_groups[0].capacity.market == "capacity_block"


def test_yaml_booleans_for_efa_are_accepted(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:node_groups"][0]["efa"] = False  # PyYAML reads `efa: off` as False
    assert parse_stack_config(base_config, stack="t").node_groups[0].efa == "off"


def test_config_values_as_json_text_are_decoded(base_config: dict[str, Any]) -> None:
    import json
    as_engine_passes_it = {k: v if isinstance(v, str) else json.dumps(v) for k, v in base_config.items()}
    spec = parse_stack_config(as_engine_passes_it, stack="t")
    assert spec.node_groups[0].instance_types == ["g5.xlarge", "g6.xlarge"]


def test_other_namespaces_are_ignored(base_config: dict[str, Any]) -> None:
    base_config["aws:profile"] = "dev"
    base_config["pulumi:tags"] = {"x": "y"}
    assert parse_stack_config(base_config, stack="t").region == "us-east-1"


def test_tags_carry_stack_identity(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:cluster"]["extra_tags"] = {"team": "llm"}
    tags = parse_stack_config(base_config, stack="dev").tags
    assert tags["gpucluster:stack"] == "organization/gpucluster/dev/test"  # org/project/stack/cluster
    assert tags["cost_center"] == "cc-1"
    assert tags["team"] == "llm"


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_shipped_stacks_are_valid(stack: str) -> None:
    name, _, spec = load_stack(stack)
    assert name == stack
    assert spec.cluster.tags.environment == stack


def test_prod_stack_shape() -> None:
    _, _, spec = load_stack("prod")
    train, evaluation = spec.node_groups
    # multi-node EFA training on-demand (a committed base + on-demand above); spot only for
    # single-node work in a group of its own, as `recommend` advises: no capacity warnings
    assert train.efa_enabled and train.capacity.on_demand_base >= 1 and train.capacity.spot_percent == 0
    assert not evaluation.efa_enabled and evaluation.capacity.spot_percent == 100
    assert train.max_nodes > 1 and spec.budget is not None and spec.datasets
    # the one warning: AWS's Lustre client key is not pinned (no published fingerprint to ship)
    assert [w.path for w in stack_warnings(spec)] == ["datasets[0].fsx.client_key_fingerprints"]


def test_dev_stack_is_spot_single_gpu() -> None:
    _, _, spec = load_stack("dev")
    group = spec.node_groups[0]
    assert group.capacity.spot_percent == 100 and all(t.gpus == 1 for t in group.types)
    assert spec.autostop.enabled and spec.autostop.idle_minutes <= 30


def test_generated_bucket_name_with_reserved_prefix_needs_a_name(base_config: dict[str, Any]) -> None:
    mutate(base_config, "gpucluster:cluster.name", "sthree-lab")
    mutate(base_config, "gpucluster:datasets", [{"name": "data"}])
    with pytest.raises(SpecError, match=r"datasets\[0\]\.bucket_name: the generated bucket name would "
                                        r"start with 'sthree-lab-data-'"):
        parse_stack_config(base_config, stack="t")
    mutate(base_config, "gpucluster:datasets", [{"name": "data", "bucket_name": "lab-data-1"}])
    assert parse_stack_config(base_config, stack="t").datasets[0].bucket_name == "lab-data-1"


def test_copy_to_scratch_needs_one_scratch_mount(base_config: dict[str, Any]) -> None:
    group = {"instance_types": ["g5.xlarge"], "max_nodes": 1}
    mutate(base_config, "gpucluster:node_groups", [{"name": "ga", **group},
                                                   {"name": "gb", "scratch_mount": "/mnt/nvme", **group}])
    mutate(base_config, "gpucluster:datasets", [{"name": "data", "access": "copy_to_scratch"}])
    with pytest.raises(SpecError, match=r"datasets\[0\]\.access: copy_to_scratch needs one "
                                        r"scratch_mount for every node group, got /mnt/nvme, /scratch"):
        parse_stack_config(base_config, stack="t")
    mutate(base_config, "gpucluster:datasets", [{"name": "data", "access": "mount"}])
    assert parse_stack_config(base_config, stack="t").datasets[0].access == "mount"


def test_fsx_zone_must_host_a_node_group_even_when_the_network_has_it(base_config: dict[str, Any]) -> None:
    """us-east-1b is a network zone, but the only node group runs in us-east-1a."""
    mutate(base_config, f"{NG}.availability_zones", ["us-east-1a"])
    mutate(base_config, "gpucluster:datasets", [{"name": "data", "access": "fsx",
                                                 "fsx": {"availability_zone": "us-east-1b"}}])
    with pytest.raises(SpecError, match=r"datasets\[0\]\.fsx\.availability_zone: no node group runs "
                                        r"in 'us-east-1b' \(node groups use us-east-1a\)"):
        parse_stack_config(base_config, stack="t")


@pytest.mark.parametrize(("size", "ok"), [(1200, True), (2400, True), (4800, True), (9600, True),
                                          (3600, False), (1800, False), (2500, False)])
def test_fsx_storage_capacity_steps(base_config: dict[str, Any], size: int, ok: bool) -> None:
    """FSx API CreateFileSystem: SCRATCH_2/PERSISTENT_2 take 1200, 2400 and steps of 2400 GiB."""
    mutate(base_config, "gpucluster:datasets", [{"name": "data", "access": "fsx", "fsx": {
        "deployment_type": "PERSISTENT_2", "throughput_per_unit_mib": 250, "storage_capacity_gib": size}}])
    if ok:
        assert parse_stack_config(base_config, stack="t").datasets[0].fsx.storage_capacity_gib == size
    else:
        with pytest.raises(SpecError, match="1200 or a multiple of 2400"):
            parse_stack_config(base_config, stack="t")


# ---------------------------------------------------------------- offerings (issue 15)


def test_primary_type_not_offered_in_its_zone_is_an_error_naming_where_it_is(
        base_config: dict[str, Any]) -> None:
    base_config["gpucluster:network"]["availability_zones"] = ["us-east-1d"]
    efa_config(base_config, instance_types=["p5e.48xlarge"])
    with pytest.raises(SpecError) as err:
        parse_stack_config(base_config, stack="t")
    [finding] = err.value.findings
    assert finding.path == "node_groups[0].instance_types[0]"
    # moto's offering data: us-east-2 and us-west-2 offer it, named first (the same geography)
    assert finding.message.startswith("p5e.48xlarge is not offered in us-east-1d; no us-east-1 zone "
                                      "offers it; us-east-2, us-west-2 and ")
    assert "as of 2026-10-27" in finding.message and len(str(finding)) <= 200


def test_not_offered_in_this_zone_names_the_zones_of_the_region_that_offer_it(
        base_config: dict[str, Any]) -> None:
    efa_config(base_config, instance_types=["p4de.24xlarge"])  # EFA: the network's first zone, 1a
    with pytest.raises(SpecError, match=r"node_groups\[0\].instance_types\[0\]: p4de.24xlarge is not "
                                        r"offered in us-east-1a; in us-east-1 it is offered in us-east-1b, "
                                        r"us-east-1c"):
        parse_stack_config(base_config, stack="t")
    base_config["gpucluster:network"]["availability_zones"] = ["us-east-1b", "us-east-1a"]
    assert parse_stack_config(base_config, stack="t").node_groups[0].instance_types == ["p4de.24xlarge"]


def test_a_fallback_not_offered_is_only_a_warning(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:network"]["availability_zones"] = ["us-east-1d"]
    efa_config(base_config, instance_types=["p5.48xlarge", "p5e.48xlarge"],
               capacity={"on_demand_base": 2})
    spec = parse_stack_config(base_config, stack="t")  # valid: the first type launches
    assert [(w.path, w.message.split(";")[0]) for w in stack_warnings(spec)] == [
        ("node_groups[0].instance_types[1]",
         "fallback p5e.48xlarge is not offered in us-east-1d, so the group never launches it there")]


def test_offerings_are_checked_per_zone_of_a_multi_zone_group(base_config: dict[str, Any]) -> None:
    base_config["gpucluster:network"]["availability_zones"] = ["us-east-1a", "us-east-1e"]
    base_config["gpucluster:node_groups"][0]["instance_types"] = ["g5.xlarge"]  # not in us-east-1e
    with pytest.raises(SpecError, match=r"g5.xlarge is not offered in us-east-1e; in us-east-1 it is "
                                        r"offered in us-east-1a, us-east-1b, us-east-1c, us-east-1d, "
                                        r"us-east-1f"):
        parse_stack_config(base_config, stack="t")


def test_multi_node_efa_group_with_spot_is_a_warning(base_config: dict[str, Any]) -> None:
    spec = parse_stack_config(efa_config(base_config, capacity={"on_demand_base": 1, "spot_percent": 50}),
                              stack="t")
    [warning] = stack_warnings(spec)
    assert warning.path == "node_groups[0].capacity.spot_percent" and warning.level == "warning"
    assert warning.message.startswith("a multi-node EFA group holds spot nodes (50 % above the base): one "
                                      "reclaimed node stops the whole collective job")
    for capacity in ({"on_demand_base": 4, "spot_percent": 100},   # max 4: no room above the base
                     {"spot_percent": 0}):
        spec = parse_stack_config(efa_config(base_config, capacity=capacity), stack="t")
        assert stack_warnings(spec) == []
    single = efa_config(base_config, efa="off", placement_group=False, capacity={"spot_percent": 100})
    assert stack_warnings(parse_stack_config(single, stack="t")) == []


@pytest.mark.usefixtures("cli_plans_once")
def test_plan_prints_the_warnings(base_config: dict[str, Any],
                                  write_stack: Callable[[dict[str, Any], str], Path]) -> None:
    base_config["gpucluster:network"]["availability_zones"] = ["us-east-1d"]
    efa_config(base_config, instance_types=["p5.48xlarge", "p5e.48xlarge"],
               capacity={"on_demand_base": 2, "spot_percent": 100})
    path = write_stack(base_config, "efa-spot")
    result = CliRunner().invoke(app, ["plan", str(path)])
    lines = result.output.splitlines()  # a warning wraps at 100 columns: its lines joined
    warnings = [" ".join([line, *(more.strip() for more in takewhile(lambda x: x.startswith("  "),
                                                                      lines[i + 1:]))])
                for i, line in enumerate(lines) if line.startswith("warning: ")]
    assert [w.split(":")[1].strip() for w in warnings] == ["node_groups[0].instance_types[1]",
                                                           "node_groups[0].capacity.spot_percent"]
    assert "a multi-node EFA group holds spot nodes (100 % above the base)" in warnings[1]
    doc = json.loads(CliRunner().invoke(app, ["plan", str(path), "--json"]).output)
    assert [w["path"] for w in doc["warnings"]] == ["node_groups[0].instance_types[1]",
                                                     "node_groups[0].capacity.spot_percent"]
    assert [w["path"] for w in json.loads(CliRunner().invoke(app, ["plan", "prod", "--json"]).output)[
        "warnings"]] == ["datasets[0].fsx.client_key_fingerprints"]
