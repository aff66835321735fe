"""Spot interruption handler: hook on exactly the reclaimed instance, notify, never scale."""

from __future__ import annotations

from typing import Any

import pytest

from gpucluster.fleet.tags import STOPPED_BY_TAG
from gpucluster.lambdas import spot_interruption

HOOK = "/opt/gpucluster/checkpoint.sh"


def interruption_event(instance_id: str, action: str = "terminate") -> dict[str, Any]:
    """EC2 user guide, "Spot Instance interruption notices" (EventBridge example)."""
    return {
        "version": "0",
        "id": "12345678-1234-1234-1234-123456789012",
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-11-21T08:22:00Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:ec2:us-east-1a:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, "instance-action": action},
    }


def rebalance_event(instance_id: str) -> dict[str, Any]:
    """EC2 user guide, "EC2 instance rebalance recommendations" (EventBridge example)."""
    return {
        "version": "0",
        "id": "12345678-1234-1234-1234-123456789012",
        "detail-type": "EC2 Instance Rebalance Recommendation",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-11-21T08:20:00Z",
        "region": "us-east-1",
        "resources": [f"arn:aws:ec2:us-east-1a:instance/{instance_id}"],
        "detail": {"instance-id": instance_id},
    }


def test_warning_runs_the_hook_on_exactly_that_instance(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("INTERRUPTION_COMMAND", HOOK)
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    target, other = cluster.instances("dev-train")

    result = spot_interruption.handler(interruption_event(target), None)

    assert result["action"] == "hook-run"
    assert (result["group"], result["instance"]) == ("dev-train", target)
    sent = recorded.of("ssm", "send_command")
    assert len(sent) == 1
    assert sent[0]["InstanceIds"] == [target]
    assert other not in sent[0]["InstanceIds"]
    commands = sent[0]["Parameters"]["commands"]
    # The node's once-per-boot wrapper, never the raw command (which the node watcher may run too).
    assert commands[-1] == (
        "/usr/local/sbin/gpucluster-interruption-hook "
        "'spot-interruption-warning via EventBridge and SSM (instance-action terminate)'"
    )
    assert HOOK not in " ".join(commands)
    assert "export GPUCLUSTER_EVENT=spot-interruption-warning" in commands
    assert "export GPUCLUSTER_INSTANCE_ACTION=terminate" in commands
    assert sent[0]["Parameters"]["executionTimeout"] == ["90"]
    published = recorded.of("sns", "publish")
    assert len(published) == 1
    assert published[0]["TopicArn"] == cluster.topic_arn
    assert target in published[0]["Message"]


def test_rebalance_recommendation_runs_the_hook_too(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("INTERRUPTION_COMMAND", HOOK)
    target = cluster.instances("dev-infer")[0]

    result = spot_interruption.handler(rebalance_event(target), None)

    assert result["event"] == "rebalance-recommendation"
    sent = recorded.of("ssm", "send_command")
    assert [s["InstanceIds"] for s in sent] == [[target]]
    assert "export GPUCLUSTER_EVENT=rebalance-recommendation" in sent[0]["Parameters"]["commands"]


def test_spot_events_never_scale_anything(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("INTERRUPTION_COMMAND", HOOK)
    target = cluster.instances("dev-train")[0]

    spot_interruption.handler(interruption_event(target), None)
    spot_interruption.handler(rebalance_event(target), None)

    mutating = {"update_auto_scaling_group", "set_desired_capacity", "create_or_update_tags"}
    assert not [name for name, _ in recorded.calls.get("autoscaling", []) if name in mutating]
    assert cluster.capacity("dev-train") == (1, 2)
    assert STOPPED_BY_TAG not in cluster.tags("dev-train")


def test_without_a_command_it_only_notifies(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)
    target = cluster.instances("dev-train")[0]

    result = spot_interruption.handler(interruption_event(target, action="stop"), None)

    assert result["action"] == "notified"
    assert result["instance_action"] == "stop"
    assert "ssm" not in recorded.calls
    assert len(recorded.of("sns", "publish")) == 1


def test_hook_wait_ends_within_the_interruption_timeout(
    cluster, recorded, stuck_ssm, monkeypatch
) -> None:
    monkeypatch.setenv("INTERRUPTION_COMMAND", HOOK)
    start = recorded.clock.now

    result = spot_interruption.handler(interruption_event(cluster.instances("dev-train")[0]), None)

    assert 90 <= recorded.clock.now - start <= 92
    assert result["hook"]["timed_out"] is True
    assert recorded.clock.sleeps and max(recorded.clock.sleeps) <= 2


def test_instance_of_another_stack_is_ignored(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("INTERRUPTION_COMMAND", HOOK)
    monkeypatch.setenv("NOTIFY_TOPIC_ARN", cluster.topic_arn)

    result = spot_interruption.handler(interruption_event(cluster.instances("prod-train")[0]), None)

    assert result["action"] == "ignored"
    assert recorded.of("ssm", "send_command") == []
    assert recorded.of("sns", "publish") == []


def test_instance_outside_any_group_is_ignored(cluster, recorded, monkeypatch) -> None:
    monkeypatch.setenv("INTERRUPTION_COMMAND", HOOK)

    result = spot_interruption.handler(interruption_event("i-0123456789abcdef0"), None)

    assert result["action"] == "ignored"
    assert recorded.of("ssm", "send_command") == []


@pytest.mark.parametrize(
    "event",
    [
        {},
        None,
        "i-0123456789abcdef0",
        [interruption_event("i-0123456789abcdef0")],
        {"detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2"},
        {**interruption_event("i-0123456789abcdef0"), "detail": "terminate"},
        {**interruption_event("i-0123456789abcdef0"), "detail": {"instance-id": 42}},
        {**interruption_event("i-0123456789abcdef0"), "detail": {"instance-id": "'; rm -rf /"}},
        {**interruption_event("i-0123456789abcdef0"), "source": "my.app"},
        {**interruption_event("i-0123456789abcdef0"), "detail-type": ["EC2"]},
        {**interruption_event("i-0123456789abcdef0"), "detail-type": "Scheduled Event"},
    ],
)
def test_malformed_events_are_ignored(cluster, recorded, monkeypatch, event) -> None:
    monkeypatch.setenv("INTERRUPTION_COMMAND", HOOK)

    result = spot_interruption.handler(event, None)

    assert result["action"] == "ignored"
    assert "ssm" not in recorded.calls


def test_the_command_sent_is_a_no_op_after_the_node_watcher_ran_the_hook(
    cluster, recorded, monkeypatch, tmp_path
) -> None:
    """The watcher saw the notice first; the Lambda's SSM command must not checkpoint again."""
    import subprocess

    from gpucluster.node.userdata import NodeBootstrap, node_env, script

    ran = tmp_path / "ran.log"
    settings = NodeBootstrap(
        stack="dev", cluster="c", node_group="g", region="us-east-1", scratch_mount="/scratch",
        efa=False, gpudirect_rdma=False, watch_spot=True, handle_rebalance=False,
        interruption_command=f'echo "$GPUCLUSTER_EVENT" >> {ran}', interruption_timeout_seconds=30,
    )
    (tmp_path / "node.env").write_text(node_env(settings))
    hook = tmp_path / "gpucluster-interruption-hook"
    hook.write_text(script("interruption-hook.sh"))
    env = {"PATH": "/usr/bin:/bin", "GPUCLUSTER_NODE_ENV": str(tmp_path / "node.env"),
           "GPUCLUSTER_STATE_DIR": str(tmp_path / "run"),
           "GPUCLUSTER_EVENT": "spot-interruption-warning"}
    watcher_run = subprocess.run(["bash", str(hook), "spot interruption notice"], env=env,
                                 capture_output=True, text=True, timeout=10)
    assert watcher_run.returncode == 0, watcher_run.stderr
    monkeypatch.setenv("INTERRUPTION_COMMAND", "/opt/gpucluster/checkpoint.sh")

    spot_interruption.handler(interruption_event(cluster.instances("dev-train")[0]), None)

    commands = recorded.of("ssm", "send_command")[0]["Parameters"]["commands"]
    shell = "\n".join(commands).replace(spot_interruption.INTERRUPTION_HOOK, f"bash {hook}")
    ssm_run = subprocess.run(["bash", "-c", shell], env={k: v for k, v in env.items()
                                                         if k != "GPUCLUSTER_EVENT"},
                             capture_output=True, text=True, timeout=10)
    assert ssm_run.returncode == 0, ssm_run.stdout + ssm_run.stderr
    assert "already ran on this boot (exit 0)" in ssm_run.stdout
    assert ran.read_text() == "spot-interruption-warning\n"  # one checkpoint on the node
