"""The CrossGuard side: the pack's wiring, its adapters, unknown values, and `policies/__main__.py`.

A PolicyPack is never constructed here (it starts a gRPC server and blocks):
the policies come from `build_policies()` and are called the way the
analyzer calls them, with pulumi_policy's own argument objects and its
unknown-checking proxies.
"""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from policy_stacks import broken_stack, good_stack
from pulumi_policy import (
    EnforcementLevel,
    PolicyProviderResource,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.policy import PolicyCustomTimeouts
from pulumi_policy.proxy import UNKNOWN_OBJECT_VALUE, UNKNOWN_STRING_VALUE, unknown_checking_proxy

from gpucluster.policy.pack import build_policies
from gpucluster.policy.records import Resource
from gpucluster.policy.rules import RULES, evaluate
from gpucluster.policy.rules.tagging import TAGGABLE

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def options(protect: bool = False) -> PolicyResourceOptions:
    return PolicyResourceOptions(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [], None)


def resource_args(record: Resource, props: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                  provider: PolicyProviderResource | None = None) -> ResourceValidationArgs:
    return ResourceValidationArgs(record.type, unknown_checking_proxy(props if props is not None else
                                                                      dict(record.props)),
                                  record.urn, record.name, options(record.protect), provider, config)


def as_deployed(record: Resource) -> dict[str, Any]:
    """A record's props the way a stack policy sees them after `pulumi up`: with id and ARN."""
    props = dict(record.props)
    if record.ids:
        props.update({"id": record.ids[0], "arn": record.ids[1]})
    return props


def stack_resources(records: list[Resource], props: dict[str, dict[str, Any]] | None = None,
                    deps: dict[str, dict[str, list[str]]] | None = None) -> list[PolicyResource]:
    found = [PolicyResource(r.type, unknown_checking_proxy((props or {}).get(r.urn, as_deployed(r))), r.urn,
                            r.name, options(r.protect), None, None, [], {}) for r in records]
    by_urn = {r.urn: r for r in found}
    for r in found:
        for key, urns in (deps or {}).get(r.urn, {}).items():
            r.property_dependencies[key] = [by_urn[u] for u in urns]
    return found


def crossguard(records: list[Resource], props: dict[str, dict[str, Any]] | None = None,
               deps: dict[str, dict[str, list[str]]] | None = None) -> set[tuple[str, str | None, str]]:
    """Every policy run as the analyzer runs it: (policy, urn or None, message) per report."""
    reports: set[tuple[str, str | None, str]] = set()
    resources = stack_resources(records, props, deps)
    for policy in build_policies():
        if isinstance(policy, ResourceValidationPolicy):
            for r in resources:
                args = ResourceValidationArgs(r.resource_type, r.props, r.urn, r.name, r.opts, None, None)
                policy.validate(args, lambda m, _u, p=policy.name, urn=r.urn: reports.add((p, urn, m)))
        else:
            policy.validate(StackValidationArgs(resources, None),
                            lambda m, u, p=policy.name: reports.add((p, u, m)))
    return reports


def test_build_policies_wires_every_rule() -> None:
    policies = build_policies()
    assert [p.name for p in policies] == [r.name for r in RULES]
    for policy, rule in zip(policies, RULES, strict=True):
        expected = ResourceValidationPolicy if rule.kind == "resource" else StackValidationPolicy
        assert isinstance(policy, expected)
        assert policy.enforcement_level == EnforcementLevel.MANDATORY
        assert policy.description == rule.description
    limits = next(p for p in policies if p.name == "environment-limits")
    assert set(limits.config_schema.properties) == {"environments", "fallback_environment"}
    assert limits.config_schema.properties["environments"]["additionalProperties"]["properties"][
        "spot_only"] == {"type": "boolean", "description": "Every GPU node must be spot."}


def test_crossguard_reports_what_plan_reports_on_the_broken_stack() -> None:
    records = broken_stack()
    offline = {(v.policy, v.urn, v.message) for v in evaluate(records)}
    assert crossguard(records) == offline
    assert {p for p, _, _ in offline} == {r.name for r in RULES}


def test_crossguard_passes_the_good_stack() -> None:
    assert crossguard(good_stack()) == set()


def _unknown_leaves(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unknown_leaves(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unknown_leaves(v) for v in value]
    return UNKNOWN_STRING_VALUE


@pytest.mark.parametrize("build", [good_stack, broken_stack])
def test_unknown_values_never_crash(build: Any) -> None:
    records = build()
    leaves = {r.urn: _unknown_leaves(dict(r.props)) for r in records}
    tops = {r.urn: dict.fromkeys(r.props, UNKNOWN_OBJECT_VALUE) for r in records}
    crossguard(records, leaves)
    crossguard(records, tops)


def test_unknown_values_never_make_a_good_stack_fail() -> None:
    records = good_stack()
    assert crossguard(records, {r.urn: _unknown_leaves(dict(r.props)) for r in records}) == set()
    tops = {r.urn: dict.fromkeys(r.props, UNKNOWN_OBJECT_VALUE) for r in records}
    assert crossguard(records, tops) == set()


def test_preview_ids_resolve_through_property_dependencies() -> None:
    """In preview the SG's id is unknown; the rule and the launch template name it as a dependency."""
    records = broken_stack()
    sg = next(r for r in records if r.name == "b-efa")
    lt = next(r for r in records if r.name == "b-train" and r.type.endswith("LaunchTemplate"))
    props = {r.urn: json.loads(json.dumps(r.props)) for r in records}
    for nic in props[lt.urn]["networkInterfaces"]:
        nic["securityGroups"] = [UNKNOWN_STRING_VALUE]
    reports = crossguard(records, props, deps={lt.urn: {"networkInterfaces": [sg.urn]}})
    assert ("efa-wiring", lt.urn, "security group b-efa has no all-traffic rule outbound to itself; EFA "
            "needs both directions (EC2 user guide, EFA security group)") in reports


def test_resource_policy_reads_config_and_unknowns() -> None:
    tags_policy = next(p for p in build_policies() if p.name == "required-cost-tags")
    bucket = Resource(type="aws:s3/bucket:Bucket", name="b", urn="urn:b")
    found: list[str] = []
    tags_policy.validate(resource_args(bucket, {"tags": {"owner": "x"}}, {"required_tags": ["owner"]}),
                         lambda m, _u: found.append(m))
    tags_policy.validate(resource_args(bucket, {"tags": UNKNOWN_OBJECT_VALUE}), lambda m, _u: found.append(m))
    tags_policy.validate(resource_args(bucket, {"tags": {"owner": "x"}}), lambda m, _u: found.append(m))
    assert found == ["missing cost tags: cost_center, environment"]


def test_provider_default_tags_are_seen() -> None:
    tags_policy = next(p for p in build_policies() if p.name == "required-cost-tags")
    provider = PolicyProviderResource("pulumi:providers:aws", unknown_checking_proxy({
        "region": "us-east-1",
        "defaultTags": json.dumps({"tags": {"cost_center": "cc", "environment": "dev"}})}), "urn:p", "aws")
    bucket = Resource(type="aws:s3/bucket:Bucket", name="b", urn="urn:b")
    found: list[str] = []
    tags_policy.validate(resource_args(bucket, {"tags": {"owner": "x"}}, provider=provider),
                         lambda m, _u: found.append(m))
    assert found == []


def test_main_builds_the_pack_when_pulumi_runs_it_from_the_policies_directory() -> None:
    """`pulumi preview --policy-pack policies` runs policies/__main__.py via runpy from that directory."""
    script = (
        "import runpy, sys, pulumi_policy\n"
        "seen = {}\n"
        "pulumi_policy.PolicyPack = lambda **kw: seen.update(kw)\n"
        "runpy.run_path('.', run_name='__main__')\n"
        "import gpucluster.catalog as c\n"
        "print(seen['name'], seen['enforcement_level'].value, len(seen['policies']), c.__file__)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO / "policies", capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    name, level, count, catalog_file = done.stdout.split()
    assert (name, level, int(count)) == ("gpucluster", "mandatory", len(RULES))
    assert Path(catalog_file).resolve() == REPO / "components" / "gpucluster" / "catalog" / "__init__.py"


def test_pulumi_policy_yaml_uses_the_project_venv() -> None:
    manifest = yaml.safe_load((REPO / "policies" / "PulumiPolicy.yaml").read_text())
    assert manifest["runtime"] == {"name": "python",
                                   "options": {"toolchain": "pip", "virtualenv": "../.venv"}}
    assert (REPO / "policies" / manifest["runtime"]["options"]["virtualenv"]).resolve() == REPO / ".venv"


@pytest.mark.parametrize("token", sorted(TAGGABLE))
def test_taggable_types_take_tags_in_pulumi_aws(token: str) -> None:
    module, class_name = token.split(":")[1].split("/")[0], token.split(":")[2]
    package = importlib.import_module(f"pulumi_aws.{'lambda_' if module == 'lambda' else module}")
    cls = getattr(package, class_name)
    assert "tags" in inspect.signature(cls._internal_init).parameters
