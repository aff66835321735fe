"""examples/: each runs as a user would run it, against the installed wheel, outside the repository.

The Python examples are copied to a temporary directory and planned under Pulumi's
mock engine by the wheel venv's interpreter (`gpucluster.plan.run_program_file`,
with the example's own `Pulumi.dev.yaml` as config), each in its own directory, one
after the other by one process: `record_resources` gives each program a fresh root
stack and config, and a second interpreter (pulumi_aws imported again) cost more
than a plan. The YAML example cannot run without the Pulumi CLI; its properties are
checked against the schema Pulumi infers from the components (the same analyzer
`pulumi package add` runs).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from wheel_venv import REPO, Venv, clean_env

EXAMPLES = REPO / "examples"

PYTHON_EXAMPLES = ("node-group-in-existing-vpc", "guard-existing-asgs")
PLAN_SCRIPT = """
import json, os, sys, yaml
from pathlib import Path
from gpucluster.plan import run_program_file
plans = {}
for workdir in sys.argv[1:]:
    os.chdir(workdir)
    project = yaml.safe_load(Path("Pulumi.yaml").read_text())["name"]
    config = yaml.safe_load(Path("Pulumi.dev.yaml").read_text())["config"]
    resources, outputs = run_program_file(Path("__main__.py"), config, project=project, stack="dev",
                                          region=config["aws:region"])
    plans[Path(workdir).name] = {"resources": [r.as_json() for r in resources], "outputs": outputs}
print(json.dumps(plans))
"""


@pytest.fixture(scope="module")
def example_plans(venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each Python example's plan, planned in a copy of its directory outside the repository."""
    workdirs = [tmp_path_factory.mktemp("examples") / name for name in PYTHON_EXAMPLES]
    for workdir in workdirs:
        shutil.copytree(EXAMPLES / workdir.name, workdir)
        assert not workdir.is_relative_to(REPO)
    done = subprocess.run([venv.python, "-c", PLAN_SCRIPT, *map(str, workdirs)], cwd=workdirs[0],
                          capture_output=True, text=True, env=clean_env(), timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    plans: dict[str, dict[str, Any]] = json.loads(done.stdout)
    return plans


def example_config(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / name / "Pulumi.dev.yaml").read_text())["config"]


def of_type(plan: dict[str, Any], token: str) -> list[dict[str, Any]]:
    return [r for r in plan["resources"] if r["type"] == token]


def test_node_group_drops_into_an_existing_vpc(example_plans: dict[str, dict[str, Any]]) -> None:
    plan = example_plans["node-group-in-existing-vpc"]
    config = example_config("node-group-in-existing-vpc")
    assert not of_type(plan, "aws:ec2/vpc:Vpc") and not of_type(plan, "aws:ec2/subnet:Subnet")
    assert not of_type(plan, "aws:ec2/securityGroup:SecurityGroup"), "the security group is the user's"
    (asg,) = of_type(plan, "aws:autoscaling/group:Group")
    (template,) = of_type(plan, "aws:ec2/launchTemplate:LaunchTemplate")
    assert asg["inputs"]["vpcZoneIdentifiers"] == config["gpu-nodes-existing-vpc:subnet_ids"]
    assert {nic["securityGroups"][0] for nic in template["inputs"]["networkInterfaces"]} == \
        {config["gpu-nodes-existing-vpc:security_group_id"]}
    assert all(nic["associatePublicIpAddress"] == "false" for nic in template["inputs"]["networkInterfaces"])
    assert template["inputs"]["metadataOptions"]["httpTokens"] == "required"
    assert (asg["inputs"]["minSize"], asg["inputs"]["maxSize"]) == (0, 4)
    distribution = asg["inputs"]["mixedInstancesPolicy"]["instancesDistribution"]
    assert distribution["onDemandBaseCapacity"] == 1
    assert distribution["onDemandPercentageAboveBaseCapacity"] == 50
    tags = {t["key"]: t["value"] for t in asg["inputs"]["tags"]}
    assert tags["gpucluster:stack"] == "gpu-nodes-existing-vpc/dev"
    (profile,) = of_type(plan, "aws:iam/instanceProfile:InstanceProfile")
    assert template["inputs"]["iamInstanceProfile"]["arn"].endswith(profile["name"])
    # New nodes wait for their GPU health check, which the profile's own role may answer for this group.
    (hook,) = of_type(plan, "aws:autoscaling/lifecycleHook:LifecycleHook")
    assert hook["inputs"]["defaultResult"] == "ABANDON"
    assert len(of_type(plan, "aws:iam/role:Role")) == 1
    (health,) = [p for p in of_type(plan, "aws:iam/rolePolicy:RolePolicy") if p["name"] == "inference-health"]
    assert health["inputs"]["role"] == profile["inputs"]["role"]
    assert set(plan["outputs"]) == {"asg_name", "launch_template_id", "node_role_arn"}


def test_guardrails_guard_groups_gpucluster_did_not_create(example_plans: dict[str, dict[str, Any]]) -> None:
    plan = example_plans["guard-existing-asgs"]
    config = example_config("guard-existing-asgs")
    (group,) = config["gpu-guardrails:groups"]
    assert not of_type(plan, "aws:autoscaling/group:Group"), "the groups exist already"
    (tag,) = of_type(plan, "aws:autoscaling/tag:Tag")
    assert tag["inputs"]["autoscalingGroupName"] == group["asg_name"]
    assert tag["inputs"]["tag"] == {"key": "gpucluster:stack", "value": "gpu-guardrails/dev",
                                    "propagateAtLaunch": True}
    (budget,) = of_type(plan, "aws:budgets/budget:Budget")
    assert budget["inputs"]["limitAmount"] == "20000"
    assert budget["inputs"]["costFilters"][0]["values"] == ["user:gpucluster:stack$gpu-guardrails/dev"]
    functions = {f["inputs"]["name"] for f in of_type(plan, "aws:lambda/function:Function")}
    assert functions == {"eks-gpu-budget-action", "eks-gpu-autostop", "eks-gpu-spot-interruption",
                         "eks-gpu-spend-guard"}
    # The scaling permission names exactly the given group.
    policies = [json.loads(p["inputs"]["policy"]) for p in of_type(plan, "aws:iam/rolePolicy:RolePolicy")]
    scale = [s for doc in policies for s in doc["Statement"]
             if "autoscaling:UpdateAutoScalingGroup" in s["Action"]]
    assert scale and all(s["Resource"] == [group["asg_arn"]] for s in scale)


def _yaml_program() -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / "yaml-guardrails" / "Pulumi.yaml").read_text())


@pytest.fixture(scope="module")
def schema_inputs() -> dict[str, Any]:
    from pulumi.provider.experimental.analyzer import Analyzer

    import gpucluster

    result = Analyzer("gpucluster").analyze([gpucluster.Guardrails])
    return {"component": result["component_definitions"]["Guardrails"],
            "types": result["type_definitions"]}


def _check_properties(values: dict[str, Any], properties: dict[str, Any], types: dict[str, Any],
                      where: str) -> None:
    unknown = set(values) - set(properties)
    assert not unknown, f"{where}: not in the schema: {sorted(unknown)}"
    required = {k for k, p in properties.items() if not p.optional}
    assert required <= set(values), f"{where}: required {sorted(required - set(values))}"
    for key, value in values.items():
        prop = properties[key]
        ref = prop.ref or (prop.items.ref if prop.items else None)
        if ref:
            type_def = types[ref.rsplit("/", 1)[-1].split(":")[-1]]
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                _check_properties(item, type_def.properties, types, f"{where}.{key}[{i}]")


def test_yaml_program_uses_the_packages_types_and_properties(schema_inputs: dict[str, Any]) -> None:
    program = _yaml_program()
    assert program["runtime"] == "yaml"
    assert (EXAMPLES / "yaml-guardrails" / program["packages"]["gpucluster"] / "PulumiPlugin.yaml").is_file()
    resource = program["resources"]["guardrails"]
    assert resource["type"] == "gpucluster:index:Guardrails"
    _check_properties(resource["properties"], schema_inputs["component"].inputs, schema_inputs["types"],
                      "guardrails")
    outputs = {v.strip("${}").split(".", 1)[1] for v in program["outputs"].values()}
    assert outputs <= set(schema_inputs["component"].outputs)
