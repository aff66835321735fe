"""The policy pack offline: the same rules over the resources `gpucluster plan` recorded.

It maps each PlannedResource onto a `Resource` record (with the id and ARN the
mock engine gave it, so references between resources resolve as they do in a
deployed stack) and evaluates every rule with the stack's policy config. It
never prints and never exits: components/gpucluster/cli/planning.py does that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulumi.runtime import MockResourceArgs

from gpucluster import conformance
from gpucluster.plan import Plan, PlanMocks, PlannedResource
from gpucluster.policy import settings
from gpucluster.policy.cloudcontrol import model_ids, native_view
from gpucluster.policy.records import Resource, Violation
from gpucluster.policy.rules import RULES, evaluate
from gpucluster.policy.rules.capacity import fallback_note


def record_of(planned: PlannedResource, mocks: PlanMocks) -> Resource:
    """A planned resource as a rule record; its ids are what the mock engine answered for it."""
    ids: list[str] = []
    if planned.custom:
        resource_id, state = mocks.new_resource(MockResourceArgs(
            typ=planned.type, name=planned.name, inputs=dict(planned.inputs), custom=True))
        ids = [v for v in (resource_id, state.get("arn"), state.get("name"), state.get("bucket"))
               if isinstance(v, str)] + list(model_ids(state.get("properties")))
    return native_view(Resource(type=planned.type, name=planned.name, props=planned.inputs, urn=planned.urn,
                                parent=planned.parent, protect=planned.protect,
                                retain_on_delete=planned.retain_on_delete, ids=tuple(dict.fromkeys(ids))))


def plan_records(plan: Plan) -> list[Resource]:
    """Every planned resource as a record the rules read."""
    mocks = PlanMocks(plan.spec.region)
    return [record_of(r, mocks) for r in plan.resources]


def check_plan(plan: Plan, config_file: Path | None = None) -> list[Violation]:
    """Run the policy pack over a plan with the given config file, else the stack's or its environment's,
    else defaults; then the provider conformance check (gpucluster.conformance).

    Raises settings.PolicyConfigError for an unreadable or invalid config file.
    """
    levels, given = _config(plan, config_file)
    return evaluate(plan_records(plan), levels, given) + conformance_violations(plan)


def conformance_violations(plan: Plan) -> list[Violation]:
    """What the provider SDKs' types and AWS's schemas refuse of the plan: always mandatory (a deploy
    would fail on it, whatever the policy config says)."""
    return [Violation(conformance.POLICY, "mandatory", f.message, f.resource_type, f.resource_name, f.urn)
            for f in conformance.check_resources(plan.resources, plan.spec.region)]


def policy_notes(plan: Plan, config_file: Path | None = None) -> list[str]:
    """What a reader of the verdict should know that is no violation: limits a stack fell back to."""
    levels, given = _config(plan, config_file)
    if levels.get("environment-limits") == "disabled":
        return []
    rule = next(r for r in RULES if r.name == "environment-limits")
    note = fallback_note(plan.spec.cluster.tags.environment, rule.settings(given.get(rule.name)))
    return [note] if note else []


def _config(plan: Plan, config_file: Path | None) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    path = config_file or settings.stack_config_path(plan.stack, plan.spec.cluster.tags.environment)
    return settings.load(path) if path else ({}, {})
