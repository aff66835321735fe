"""The node-group seam (`lambdas.nodegroups`) through its Auto Scaling backend (`lambdas.asg`), under moto.

Every guardrail and `ops` change goes through `NodeGroups`: these tests pin
what a backend must do, so a next backend (PCS, a stored guard state) can be
held to the same table of cases.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpucluster.fleet import nodegroups, stops
from gpucluster.fleet.asg import AutoScalingGroups
from gpucluster.fleet.nodegroups import (
    ALREADY_AT_ZERO,
    ALREADY_STOPPED,
    BUDGET,
    ESCALATED,
    STOPPED,
    NodeGroup,
    NodeGroups,
    StopState,
)
from gpucluster.fleet.tags import PREVIOUS_DESIRED_TAG, PREVIOUS_MIN_TAG, STATE_TAGS, STOPPED_BY_TAG
from moto_groups import tag_node_group


@pytest.fixture
def backend(cluster: Any) -> NodeGroups:
    return AutoScalingGroups(cluster.autoscaling)


def _one(backend: NodeGroups, name: str) -> NodeGroup:
    [group] = backend.read_groups([name])
    return group


def test_the_auto_scaling_backend_is_a_node_groups_backend(backend: NodeGroups) -> None:
    assert isinstance(backend, AutoScalingGroups)
    assert {"list_groups", "read_groups", "stop", "relabel", "restore", "set_capacity"} <= set(dir(backend))


def test_list_groups_selects_by_identity_and_reads_capacity_and_members(cluster: Any,
                                                                         backend: NodeGroups) -> None:
    tag_node_group(cluster.autoscaling, "dev-train", "a10")

    groups = backend.list_groups("dev")

    assert [g.name for g in groups] == ["dev-infer", "dev-train"]  # sorted; prod-train is another stack's
    train = groups[1]
    assert (train.node_group, train.stack, train.label) == ("a10", "dev", "a10")
    assert (train.min_size, train.desired, train.max_size) == (1, 2, 4)
    assert train.stop == StopState() and train.running
    assert sorted(train.in_service_ids) == cluster.instances("dev-train") and len(train.in_service_ids) == 2
    assert train.healthy == 2
    assert groups[0].label == "dev-infer"  # no node-group tag: the group's own name
    assert backend.list_groups("nosuch") == []


def test_read_groups_skips_missing_names(backend: NodeGroups) -> None:
    found = backend.read_groups(["dev-train", "gone", "prod-train"])
    assert [g.name for g in found] == ["dev-train", "prod-train"]
    assert backend.read_groups([]) == []


def test_stop_records_reason_and_previous_capacity(cluster: Any, backend: NodeGroups) -> None:
    assert backend.stop(_one(backend, "dev-train"), "idle") == STOPPED

    group = _one(backend, "dev-train")
    assert (group.min_size, group.desired, group.max_size) == (0, 0, 4)
    assert group.stop == StopState("idle", "2", "1")
    assert [cluster.tags("dev-train")[k] for k in STATE_TAGS] == ["idle", "2", "1"]
    assert STOPPED_BY_TAG not in cluster.tags("prod-train")  # another stack's group untouched
    assert cluster.capacity("prod-train") == (1, 1)


def test_stop_is_idempotent_and_budget_escalates(backend: NodeGroups) -> None:
    backend.stop(_one(backend, "dev-train"), "schedule")

    assert backend.stop(_one(backend, "dev-train"), "idle") == ALREADY_STOPPED
    assert _one(backend, "dev-train").stop == StopState("schedule", "2", "1")
    assert backend.stop(_one(backend, "dev-train"), BUDGET) == ESCALATED
    assert _one(backend, "dev-train").stop == StopState(BUDGET, "2", "1")  # capacity before the first stop
    assert backend.stop(_one(backend, "dev-train"), "schedule") == ALREADY_STOPPED
    assert _one(backend, "dev-train").stopped_by == BUDGET  # nothing outranks the budget


def test_a_group_at_zero_by_its_own_config_is_not_stopped(cluster: Any, backend: NodeGroups) -> None:
    backend.set_capacity("dev-infer", 0, 0)

    assert backend.stop(_one(backend, "dev-infer"), BUDGET) == ALREADY_AT_ZERO
    assert not set(STATE_TAGS) & set(cluster.tags("dev-infer"))


def test_a_restarted_group_keeps_its_budget_label_on_the_next_stop(backend: NodeGroups) -> None:
    backend.stop(_one(backend, "dev-train"), BUDGET)
    backend.set_capacity("dev-train", 1, 3)  # restarted by hand, tags left

    assert backend.stop(_one(backend, "dev-train"), "idle") == STOPPED
    assert _one(backend, "dev-train").stop == StopState(BUDGET, "3", "1")


def test_stop_refuses_an_unknown_reason(backend: NodeGroups) -> None:
    with pytest.raises(ValueError, match="unknown stop reason"):
        backend.stop(_one(backend, "dev-train"), "bored")


def test_restore_puts_back_the_recorded_capacity_and_clears_the_stop(cluster: Any,
                                                                      backend: NodeGroups) -> None:
    backend.stop(_one(backend, "dev-train"), "idle")

    result = backend.restore(_one(backend, "dev-train"))

    assert (result.action, result.stopped_by) == ("resumed", "idle")
    assert (result.min_size, result.desired_capacity) == (1, 2)
    group = _one(backend, "dev-train")
    assert (group.min_size, group.desired) == (1, 2) and group.stop == StopState()
    assert not set(STATE_TAGS) & set(cluster.tags("dev-train"))


def test_restore_only_undoes_the_stops_it_may(backend: NodeGroups) -> None:
    backend.stop(_one(backend, "dev-train"), BUDGET)

    result = backend.restore(_one(backend, "dev-train"), only_stopped_by={"schedule"})

    assert (result.action, result.reason) == ("skipped", "stopped by budget")
    assert _one(backend, "dev-train").desired == 0
    assert backend.restore(_one(backend, "dev-infer")).reason == "not stopped by a guardrail"


def test_restore_without_a_recorded_capacity_is_skipped(cluster: Any, backend: NodeGroups) -> None:
    backend.set_capacity("dev-train", 0, 0)
    backend.relabel(_one(backend, "dev-train"), "idle", StopState())

    result = backend.restore(_one(backend, "dev-train"))

    assert (result.action, result.stopped_by) == ("skipped", "idle")
    assert PREVIOUS_DESIRED_TAG in result.reason
    assert cluster.capacity("dev-train") == (0, 0)


def test_relabel_writes_only_the_previous_values_given(cluster: Any, backend: NodeGroups) -> None:
    backend.stop(_one(backend, "dev-train"), "idle")
    cluster.autoscaling.delete_tags(Tags=[{"ResourceId": "dev-train", "ResourceType": "auto-scaling-group",
                                           "Key": PREVIOUS_MIN_TAG}])

    backend.relabel(_one(backend, "dev-train"), BUDGET, StopState(None, None, "1"))

    assert _one(backend, "dev-train").stop == StopState(BUDGET, "2", "1")


def test_set_capacity_leaves_max_and_stop_state_alone(backend: NodeGroups) -> None:
    backend.stop(_one(backend, "dev-train"), "manual")
    backend.set_capacity("dev-train", 0, 1)

    group = _one(backend, "dev-train")
    assert (group.min_size, group.desired, group.max_size) == (0, 1, 4)
    assert group.stopped_by == "manual"


def test_budget_confirmation_puts_back_what_a_concurrent_start_undid(backend: NodeGroups) -> None:
    report = stops.stop_groups(backend, backend.list_groups("dev"), BUDGET)
    assert report.changed == ["dev-infer", "dev-train"]
    assert report.recorded["dev-train"] == StopState(None, "2", "1")
    backend.restore(_one(backend, "dev-train"))  # a start that read the group before the budget wrote

    corrections = stops.confirm_budget_stops(backend, report)

    assert list(corrections) == ["dev-train"]
    assert _one(backend, "dev-train").stop == StopState(BUDGET, "2", "1")
    assert _one(backend, "dev-train").desired == 0


def test_the_rules_are_pure_over_the_values() -> None:
    running = NodeGroup("g", "ng", "dev", 1, 2, 4, StopState(BUDGET, "5", "1"))
    assert nodegroups.stop_label(running, "idle") == BUDGET
    assert nodegroups.previous_capacity(running) == StopState(None, "2", "1")
    stopped = NodeGroup("g", "ng", "dev", 0, 0, 3, StopState("idle", "5", "2"))
    assert nodegroups.previous_capacity(stopped) == StopState(None, "5", "2")
    decision = nodegroups.resume_decision(stopped)
    # desired capped at the maximum, min at desired
    assert (decision.action, decision.min_size, decision.desired_capacity) == ("resume", 2, 3)
