"""One identity per deployment: `<organization>/<project>/<stack>/<cluster>`, the same everywhere.

`pulumi up` builds it from `pulumi.get_organization()`, `get_project()`, `get_stack()` and the
cluster name; the CLI (status, resume, doctor) from the stack file, the Pulumi.yaml above it and
`gpucluster:organization`. These tests run the program as `pulumi up` would (the mock engine
given the deployment's organization, project and stack) and check that every place the identity
reaches holds the value the CLI computes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.runtime.config import set_all_config

from gpucluster import program
from gpucluster.plan import PlannedResource, load_stack, record_resources
from gpucluster.preflight import parse_stack_config
from gpucluster.project import project_name
from gpucluster.spec import IDENTITY_MAX, SpecError, stack_identity

ASG = "aws:autoscaling/group:Group"
LAMBDA = "aws:lambda/function:Function"
BUDGET = "aws:budgets/budget:Budget"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
# Characters AWS tags allow in every service (Tagging AWS resources, "Tag naming limits").
AWS_TAG_VALUE = re.compile(r"[\w .:/=+@-]{1,256}")


def guarded(config: dict[str, Any]) -> dict[str, Any]:
    """A config with every guardrail: budget with its action, idle stop with a hook, spot hook."""
    return {**config,
            "gpucluster:budget": {"monthly_limit_usd": 500, "action_threshold_percent": 100},
            "gpucluster:autostop": {"idle_minutes": 30, "pre_stop_command": "/opt/ckpt.sh",
                                    "stop_schedule": "cron(0 19 ? * * *)"},
            "gpucluster:spot": {"interruption_command": "/opt/ckpt.sh"}}


def deploy(config: dict[str, Any], *, stack: str, project: str,
           organization: str | None) -> list[PlannedResource]:
    """Run the Pulumi program as `pulumi up` would: the engine gives organization, project and stack."""
    set_all_config({k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()})
    resources, _ = record_resources(program.run, stack=stack, region="us-east-1", project=project,
                                    organization=organization)
    return resources


def identity_everywhere(resources: list[PlannedResource]) -> dict[str, set[str]]:
    """Every value the deployment's identity takes, by where it reaches."""
    found: dict[str, set[str]] = {"asg tag": set(), "instance tag": set(), "lambda env": set(),
                                  "budget filter": set(), "iam condition": set(), "node env": set()}
    for r in resources:
        if r.type == ASG:
            found["asg tag"] |= {t["value"] for t in r.inputs["tags"] if t["key"] == "gpucluster:stack"}
        if r.type == LAUNCH_TEMPLATE:
            for spec in r.inputs["tagSpecifications"]:
                found["instance tag"].add(spec["tags"]["gpucluster:stack"])
            script = _user_data(r.inputs["userData"])
            found["node env"] |= set(re.findall(r"^GPUCLUSTER_STACK=(\S+)$", script, re.M))
        if r.type == LAMBDA:
            found["lambda env"].add(r.inputs["environment"]["variables"]["GPUCLUSTER_STACK"])
        if r.type == BUDGET:
            [cost_filter] = r.inputs["costFilters"]
            [value] = cost_filter["values"]
            found["budget filter"].add(value.removeprefix("user:gpucluster:stack$"))
        if r.type == ROLE_POLICY:
            for statement in json.loads(r.inputs["policy"])["Statement"]:
                for condition in statement.get("Condition", {}).values():
                    found["iam condition"] |= {v for k, v in condition.items()
                                               if k.endswith("/gpucluster:stack")}
    return found


def only(identity: str) -> dict[str, set[str]]:
    """`identity_everywhere` of a deployment whose every place holds `identity` and nothing else."""
    return {where: {identity} for where in ("asg tag", "instance tag", "lambda env", "budget filter",
                                            "iam condition", "node env")}


def _user_data(encoded: str) -> str:
    import base64
    import gzip

    return gzip.decompress(base64.b64decode(encoded)).decode()


# --------------------------------------------------------------------- the value


def test_identity_is_organization_project_stack_and_cluster() -> None:
    assert stack_identity("acme", "ml-infra", "dev", "gpu-dev") == "acme/ml-infra/dev/gpu-dev"


def test_the_longest_names_still_fit_an_aws_tag_readable_and_unique() -> None:
    """Pulumi allows 100-character organization, project and stack names: 327 characters joined."""
    long = ["o" * 100, "p" * 100, "s" * 100, "c" * 24]
    first = stack_identity(*long)
    second = stack_identity(long[0], long[1], long[2], "d" * 24)
    assert len(first) == len(second) == IDENTITY_MAX
    assert first.startswith("o" * 100 + "/" + "p" * 100 + "/") and first != second
    assert re.fullmatch(r".+\+[0-9a-f]{16}", first)
    for value in (first, stack_identity("acme.io", "ml_infra", "dev.eu-1", "gpu-dev")):
        assert AWS_TAG_VALUE.fullmatch(value) and not value.lower().startswith("aws:")


def test_two_dev_stacks_of_two_teams_get_two_identities(base_config: dict[str, Any]) -> None:
    team_a = parse_stack_config({**base_config, "gpucluster:organization": "team-a"}, stack="dev")
    team_b = parse_stack_config(base_config, stack="dev", project="research")
    assert (team_a.identity, team_b.identity) == ("team-a/gpucluster/dev/test",
                                                  "organization/research/dev/test")
    assert team_a.tags["gpucluster:stack"] == team_a.identity


@pytest.mark.parametrize(("key", "value", "path"), [
    ("gpucluster:organization", "acme corp", "gpucluster:organization"),
    ("gpucluster:organization", "", "gpucluster:organization"),
])
def test_bad_organization_names_the_key(base_config: dict[str, Any], key: str, value: str, path: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_stack_config({**base_config, key: value}, stack="dev")
    assert [f.path for f in info.value.findings] == [path]
    assert "a Pulumi name" in str(info.value)


def test_a_misspelt_organization_key_gets_a_hint(base_config: dict[str, Any]) -> None:
    with pytest.raises(SpecError, match="did you mean 'gpucluster:organization'"):
        parse_stack_config({**base_config, "gpucluster:organisation": "acme"}, stack="dev")


def test_a_bad_project_name_says_where_it_comes_from(base_config: dict[str, Any]) -> None:
    with pytest.raises(SpecError) as info:
        parse_stack_config(base_config, stack="dev", project="ml infra")
    assert [f.path for f in info.value.findings] == ["project (Pulumi.yaml name)"]


# -------------------------------------------- pulumi up and the CLI agree on it


@pytest.fixture
def project(tmp_path: Path, base_config: dict[str, Any]) -> Path:
    """A Pulumi project `ml-infra` (stacks in stacks/) whose dev stack is in organization acme."""
    (tmp_path / "Pulumi.yaml").write_text(yaml.safe_dump(
        {"name": "ml-infra", "runtime": "python", "stackConfigDir": "stacks"}))
    (tmp_path / "stacks").mkdir()
    config = guarded({**base_config, "gpucluster:organization": "acme"})
    path = tmp_path / "stacks" / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False))
    return path


def test_the_cli_and_pulumi_up_compute_the_same_identity(project: Path) -> None:
    name, config, cli_spec = load_stack(str(project))  # what status, resume and doctor use
    assert (name, project_name(project), cli_spec.identity) == ("dev", "ml-infra", "acme/ml-infra/dev/test")

    resources = deploy(config, stack="dev", project="ml-infra", organization="acme")

    everywhere = identity_everywhere(resources)
    assert everywhere == only(cli_spec.identity)


def test_the_cli_reads_the_project_of_the_stack_file_not_of_the_current_directory(
        project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("other")
    (elsewhere / "Pulumi.yaml").write_text("name: other-project\nruntime: python\n")
    monkeypatch.chdir(elsewhere)
    assert load_stack(str(project))[2].identity == "acme/ml-infra/dev/test"
    outside = elsewhere / "Pulumi.x.yaml"  # no Pulumi.yaml above it: the current directory's project
    outside.write_text(project.read_text())
    assert project_name(outside) == "other-project"


def test_pulumi_up_in_another_organization_than_the_stack_file_says_fails(project: Path) -> None:
    _, config, _ = load_stack(str(project))
    with pytest.raises(pulumi.RunError, match="gpucluster:organization: is 'acme', but this stack deploys "
                                              "in Pulumi organization 'globex'"):
        deploy(config, stack="dev", project="ml-infra", organization="globex")


def test_pulumi_cloud_needs_the_organization_in_the_stack_file(base_config: dict[str, Any]) -> None:
    """Without the key the CLI assumes a self-managed backend: `pulumi up` in a real organization
    stops with the line to add, so the CLI never looks for the wrong identity."""
    with pytest.raises(SpecError) as info:
        parse_stack_config(base_config, stack="dev", organization="acme")
    assert str(info.value) == (
        "gpucluster:organization: deploying in Pulumi organization 'acme': add "
        "`gpucluster:organization: acme` to the stack file (status, resume and doctor compute the "
        "gpucluster:stack identity from it)")
    assert len(str(info.value)) <= 200
    spec = parse_stack_config(base_config, stack="dev", organization="organization")  # a DIY backend
    assert spec.identity == "organization/gpucluster/dev/test"


def test_two_clusters_named_dev_in_one_account_share_nothing(base_config: dict[str, Any]) -> None:
    """Two teams' `dev` stacks (other organization, other project): no value of one in the other."""
    team_a = deploy(guarded({**base_config, "gpucluster:organization": "team-a"}),
                    stack="dev", project="gpucluster", organization="team-a")
    team_b = deploy(guarded(base_config), stack="dev", project="research", organization=None)
    a, b = identity_everywhere(team_a), identity_everywhere(team_b)
    assert a == only("team-a/gpucluster/dev/test")
    assert b == only("organization/research/dev/test")


def test_a_cluster_built_in_a_programs_own_code_takes_the_deployments_identity() -> None:
    """GpuCluster args without organization/project/stack: the running deployment's are used."""
    from gpucluster.aws.cluster import GpuCluster

    args = {"cluster": {"name": "lab", "tags": {"owner": "ml", "cost_center": "cc-1", "environment": "dev"}},
            "network": {"availability_zones": ["us-east-1a"], "vpc_cidr": "10.8.0.0/16"},
            "node_groups": [{"name": "gpu", "instance_types": ["g5.xlarge"], "max_nodes": 1}],
            "budget": {"monthly_limit_usd": 100}, "notifications": {"emails": ["ml@example.com"]},
            "region": "us-east-1"}
    resources, _ = record_resources(lambda: GpuCluster("lab", args), stack="prod",  # type: ignore[arg-type]
                                    project="platform", organization="acme")
    found = identity_everywhere(resources)
    assert found["asg tag"] == found["budget filter"] == {"acme/platform/prod/lab"}

