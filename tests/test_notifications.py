"""Every stack's guardrails report to someone: a stack whose guardrail topic would have no subscriber is
refused with one finding naming the key, and the topic subscribes notifications.emails and budget.emails
once each (spec.subscribers keeps notifications.emails first)."""

from __future__ import annotations

from typing import Any

import pytest

from base_config import base, plan_config
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError

SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"


def without_subscribers() -> dict[str, Any]:
    config = base()
    del config["gpucluster:notifications"]
    return config


def test_a_stack_without_a_subscriber_is_refused_naming_the_key() -> None:
    with pytest.raises(SpecError) as err:
        parse_stack_config(without_subscribers(), stack="t")
    [finding] = err.value.findings
    assert finding.path == "notifications.emails"
    assert "no subscriber" in finding.message and "budget.emails" in finding.message


def test_budget_emails_alone_are_subscribers_enough() -> None:
    config = without_subscribers()
    config["gpucluster:budget"] = {"monthly_limit_usd": 100, "emails": ["finops@example.com"]}
    assert parse_stack_config(config, stack="t").subscribers == ["finops@example.com"]
    config["gpucluster:notifications"] = {"emails": ["oncall@example.com", "finops@example.com"]}
    assert parse_stack_config(config, stack="t").subscribers == ["oncall@example.com", "finops@example.com"]


def test_an_empty_list_is_no_subscriber() -> None:
    config = without_subscribers()
    config["gpucluster:notifications"] = {"emails": []}
    config["gpucluster:budget"] = {"monthly_limit_usd": 100}
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    assert [f.path for f in err.value.findings] == ["notifications.emails"]


def test_the_topic_subscribes_each_address_once() -> None:
    config = base()
    config["gpucluster:notifications"] = {"emails": ["oncall@example.com", "finops@example.com"]}
    config["gpucluster:budget"] = {"monthly_limit_usd": 100,
                                   "emails": ["finops@example.com", "cfo@example.com"]}
    plan = plan_config(config)
    subscriptions = plan.of_type(SUBSCRIPTION)
    # the plan lists resources by name, not in creation order: compare as a sorted list (no duplicate)
    assert sorted((s.inputs["protocol"], s.inputs["endpoint"]) for s in subscriptions) == [
        ("email", "cfo@example.com"), ("email", "finops@example.com"), ("email", "oncall@example.com")]
    topic_arns = {s.inputs["topic"] for s in subscriptions}
    assert len(topic_arns) == 1
