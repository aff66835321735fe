"""What keeps `gpucluster plan` fast, as behaviour (the timings themselves: benchmarks/plan_time.py)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpucluster import cli
from gpucluster.cli import app
from gpucluster.policy import rules
from gpucluster.policy.records import Resource

REPO = Path(__file__).resolve().parent.parent
# resources, input types, enums, functions (and their _output form), a package named with a trailing _
SERVICES = ("ssm", "lambda_")

# What every public name of a service package is, by the module that defines it.
NAMES = """
import importlib, json, sys, types
def ident(v):
    if isinstance(v, types.ModuleType): return "module " + v.__name__
    if hasattr(v, "__qualname__") and hasattr(v, "__module__"): return v.__module__ + "." + v.__qualname__
    return type(v).__name__ + " " + repr(v)[:60]
"""
EAGER = NAMES + """
import pulumi_aws
out = {}
for s in sys.argv[1:]:
    m = importlib.import_module("pulumi_aws." + s)
    getattr(m, "__all__", None)  # the lazy package loads in full
    out[s] = {n: ident(v) for n, v in vars(m).items() if not n.startswith("_") and n != "typing"}
print(json.dumps(out))
"""
NARROW = NAMES + """
import gpucluster.aws, pulumi_aws
names, got, loaded_in_full = json.load(sys.stdin), {}, []
for s in sys.argv[1:]:
    m = getattr(pulumi_aws, s)
    got[s] = {n: ident(getattr(m, n)) for n in names[s]}
    if type(m).__name__ != "_ServicePackage":
        loaded_in_full.append(s)
# a name it cannot place (dir() here) loads the whole package, which is then a plain module
everything = "Document" in dir(pulumi_aws.ssm) and type(pulumi_aws.ssm).__name__ == "module"
print(json.dumps({"got": got, "loaded_in_full": loaded_in_full, "dir_loads_everything": everything}))
"""


def python(code: str, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    return subprocess.run([sys.executable, "-c", code, *args], input=stdin, capture_output=True, text=True,
                          check=True, cwd=REPO, env=env).stdout


def test_service_packages_load_by_name_and_mean_what_they_always_meant() -> None:
    """Every public name of a service package is the same object as with pulumi_aws's own eager import,
    and none of them needs the whole package loaded."""
    eager = json.loads(python(EAGER, *SERVICES))
    narrow = json.loads(python(NARROW, *SERVICES, stdin=json.dumps(eager)))
    assert narrow["loaded_in_full"] == []
    for service in SERVICES:
        assert len(eager[service]) > 20
        assert narrow["got"][service] == eager[service], service
    assert narrow["dir_loads_everything"] is True


def test_commands_that_need_no_pulumi_do_not_import_it() -> None:
    """`cost`, `recommend` and `--version` read stack files and the catalog only: no Pulumi, no boto3."""
    code = ("import sys; from typer.testing import CliRunner; from gpucluster.cli import app; "
            "r = CliRunner(); "
            "codes = [r.invoke(app, a).exit_code for a in (['cost', 'prod'], ['recommend', '--params', '7b', "
            "'--mode', 'inference'], ['--version'])]; "
            "print(codes, sorted(m for m in ('pulumi', 'pulumi_aws', 'boto3') if m in sys.modules))")
    assert python(code).strip() == "[0, 0, 0] []"


# ---------------------------------------------------------------- plan --json


# `gpucluster plan prod --json`, then how many pulumi_aws modules it loaded and whether boto3 and
# matplotlib (`cost --chart` only) did (on stderr).
PLAN_AND_COUNT = """
import sys
from gpucluster.cli import entry
try:
    entry.main(["plan", "prod", "--json"])
except SystemExit as done:
    loaded = [m for m in sys.modules if m.startswith("pulumi_aws.") and m.count(".") == 2]
    ec2 = [m for m in loaded if m.startswith("pulumi_aws.ec2.")]
    print(len(loaded), len(ec2), *(int(m in sys.modules) for m in ("boto3", "matplotlib")), file=sys.stderr)
    raise
"""


def test_plan_json_is_byte_identical_from_run_to_run_and_loads_only_the_modules_it_uses(
        cli_plans_once: None) -> None:
    """Two processes (this one and a fresh one), two hash seeds: the same bytes (resource order,
    archives by content hash)."""
    here = CliRunner().invoke(app, ["plan", "prod", "--json"])
    seed = "1" if os.environ.get("PYTHONHASHSEED") != "1" else "2"
    fresh = subprocess.run([sys.executable, "-c", PLAN_AND_COUNT], cwd=REPO, capture_output=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}, check=False)
    assert (here.exit_code, fresh.returncode) == (0, 0), fresh.stderr
    assert fresh.stdout == here.stdout_bytes
    total, ec2, boto3, matplotlib = map(int, fresh.stderr.split())
    assert ec2 < 25, "ec2 alone has 182 modules; the program uses 12 of its classes"
    assert total < 120, "every service package in full: 487 modules"
    assert boto3 == 0, "a plan calls no AWS API (the restart handler imported for two names cost 0.1 s)"
    assert matplotlib == 0, "only `cost --chart` draws"
    doc = json.loads(fresh.stdout)
    code = next(r for r in doc["resources"] if r["type"] == "aws:lambda/function:Function")["inputs"]["code"]
    assert len(code["sha256"]) == 64 and len(code["files"]) >= 4  # each handler module by its hash
    assert b" object at 0x" not in fresh.stdout


def test_each_groups_user_data_is_rendered_once_however_often_the_stack_is_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan checks the stack's user data size four times (parsed by the CLI and by the program,
    warnings, the component's args): each group's user data is rendered and gzipped once."""
    from gpucluster.aws.args import stack_checks
    from gpucluster.node import userdata
    from gpucluster.project import load_stack
    from gpucluster.spec import stack_warnings

    rendered: list[str] = []
    real = userdata.render_user_data
    monkeypatch.setattr(userdata, "render_user_data",
                        lambda b, source=None: rendered.append(b.node_group) or real(b, source))
    userdata.gzipped_size.cache_clear()
    stack = str(REPO / "stacks" / "Pulumi.prod.yaml")
    specs = [load_stack(stack)[2], load_stack(stack)[2]]
    stack_warnings(specs[0])
    list(stack_checks(specs[1]))
    assert sorted(rendered) == sorted(g.name for g in specs[0].node_groups)  # h100-train, eval: once each


# ------------------------------------------------------------ policies scale


def efa_stack(groups: int) -> list[Resource]:
    """`groups` EFA node groups as the program builds them: a security group with all-traffic self
    rules, a launch template naming it on 32 EFA interfaces, an ASG in a cluster placement group."""
    out: list[Resource] = []
    for i in range(groups):
        sg, lt, pg = f"sg-{i}", f"lt-{i}", f"pg-{i}"
        out += [Resource(rules.SECURITY_GROUP, sg, {"vpcId": "vpc-1"}, urn=f"urn:{sg}", ids=(sg,)),
                Resource(rules.PLACEMENT_GROUP, pg, {"strategy": "cluster"}, urn=f"urn:{pg}", ids=(pg,))]
        for kind, name in ((rules.SG_INGRESS_RULE, "in"), (rules.SG_EGRESS_RULE, "out")):
            out.append(Resource(kind, f"{sg}-{name}", {"securityGroupId": sg, "referencedSecurityGroupId": sg,
                                                       "ipProtocol": "-1"}, urn=f"urn:{sg}-{name}"))
        nics = [{"networkCardIndex": card, "deviceIndex": 0, "interfaceType": "efa-only" if card else "efa",
                 "securityGroups": [sg], "subnetId": "subnet-1"} for card in range(32)]
        lt_props = {"networkInterfaces": nics, "instanceType": "p5.48xlarge"}
        out.append(Resource(rules.LAUNCH_TEMPLATE, lt, lt_props, urn=f"urn:{lt}", ids=(lt,)))
        asg_props = {"launchTemplate": {"id": lt}, "maxSize": 2, "vpcZoneIdentifiers": ["subnet-1"],
                     "placementGroup": pg}
        out.append(Resource(rules.ASG, f"asg-{i}", asg_props, urn=f"urn:asg-{i}"))
    return out


@pytest.mark.parametrize("rule", ["efa-wiring", "intra-group-traffic"])
def test_security_group_rules_are_linear_in_node_groups(monkeypatch: pytest.MonkeyPatch, rule: str) -> None:
    """Each security group is resolved and judged once, not once per EFA interface per group, and the
    standalone rules are filed by group once, not scanned again for every group."""
    calls = {"n": 0}
    resolve = rules.Stack.resolve

    def counting(self: Any, *args: Any) -> Any:
        calls["n"] += 1
        return resolve(self, *args)

    monkeypatch.setattr(rules.Stack, "resolve", counting)
    counts = {}
    for groups in (4, 8, 16):
        calls["n"] = 0
        assert rules.evaluate(efa_stack(groups), {r.name: "disabled" for r in rules.RULES
                                                  if r.name != rule}) == []
        counts[groups] = calls["n"]
    assert counts[16] - counts[8] == 2 * (counts[8] - counts[4])  # a straight line
    assert counts[16] <= 16 * 10


def test_efa_wiring_still_finds_a_missing_self_rule() -> None:
    stack = [r for r in efa_stack(3) if r.name != "sg-1-out"]
    found = [v for v in rules.evaluate(stack) if v.policy == "efa-wiring"]
    assert [(v.resource_name, v.message) for v in found] == [
        ("lt-1", "security group sg-1 has no all-traffic rule outbound to itself; EFA needs both directions "
                 "(EC2 user guide, EFA security group)")]


# ------------------------------------------------------------------------- GC


def test_the_command_runs_without_the_cyclic_collector_and_freezes_at_exit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """... and without pydantic's plugin search, unless the user's environment says otherwise."""
    seen: dict[str, Any] = {}
    monkeypatch.setenv("PYDANTIC_DISABLE_PLUGINS", "-")  # recorded, so the test leaves it as it was
    monkeypatch.delenv("PYDANTIC_DISABLE_PLUGINS")
    monkeypatch.setattr("gpucluster.cli.entry.main", lambda: seen.setdefault("enabled", gc.isenabled()))
    monkeypatch.setattr(gc, "freeze", lambda: seen.setdefault("frozen", True))
    was = gc.isenabled()
    gc.enable()
    try:
        cli.main()
    finally:
        if not was:
            gc.disable()
    assert seen == {"enabled": False, "frozen": True}
    assert os.environ["PYDANTIC_DISABLE_PLUGINS"] == "__all__"
    monkeypatch.setenv("PYDANTIC_DISABLE_PLUGINS", "")  # a user who wants their plugins keeps them
    cli.main()
    assert os.environ["PYDANTIC_DISABLE_PLUGINS"] == ""


# ------------------------------------------------------------------ one command built


@pytest.mark.parametrize("args", [["plan", "prod"], ["--stacks-dir", "stacks", "status", "--help"],
                                  ["capacity", "buy", "--help"], ["plan", "prod", "--tree"]])
def test_a_run_builds_only_the_command_it_invokes_and_says_the_same(args: list[str],
                                                                   cli_plans_once: None) -> None:
    from gpucluster.cli.entry import app_for

    only = app_for(args)
    names = [c.name or c.callback.__name__ for c in only.registered_commands] + [
        g.name for g in only.registered_groups]
    assert names == [args[2] if args[0] == "--stacks-dir" else args[0]]
    runner = CliRunner()
    whole, one = runner.invoke(app, args), runner.invoke(only, args)
    assert (one.exit_code, one.output) == (whole.exit_code, whole.output)


@pytest.mark.parametrize("args", [[], ["--help"], ["--version"], ["plna", "prod"], ["--stacks-dir"]])
def test_no_command_or_an_unknown_one_gets_the_whole_app(args: list[str]) -> None:
    from gpucluster.cli.entry import app_for

    assert app_for(args) is app


# `gpucluster plan dev` (no observability, no Slurm, no EKS), then the loaded modules of features it does not
# use (pulumi_aws puts a lazy stub of every service package in sys.modules: a loaded one has submodules).
PLAN_DEV_FEATURES = """
import json, sys
from gpucluster.cli import entry
try:
    entry.main(["plan", "dev"])
except SystemExit:
    features = ("gpucluster.aws.prometheus", "gpucluster.aws.grafana_dashboards", "gpucluster.dashboards",
                "gpucluster.ops.dashboards", "gpucluster.aws.pcs", "pulumi_aws.grafana.", "pulumi_aws.amp.",
                "pulumi_aws_native", "pulumi_kubernetes", "kubernetes", "matplotlib", "boto3")
    print(json.dumps(sorted(m for m in sys.modules if m.startswith("gpucluster"))), file=sys.stderr)
    print(sorted(m for m in sys.modules if m.startswith(features)), "gpucluster.aws.cluster" in sys.modules,
          file=sys.stderr)
    raise
"""
# Every gpucluster module a plan of dev loads (issue 38). A module new here is import time every command
# pays: if a plan of dev needs it, add it; if not, import it where it is used (a command of its own, a
# feature the stack turns on). `gpucluster.cli.entry` imports only the invoked command's module.
DEV_PLAN_MODULES = frozenset({
    "gpucluster", "gpucluster.aws", "gpucluster.aws.amis", "gpucluster.aws.args", "gpucluster.aws.children",
    "gpucluster.aws.cluster", "gpucluster.aws.datasets", "gpucluster.aws.guardrail_budget",
    "gpucluster.aws.guardrail_events", "gpucluster.aws.guardrail_lambda", "gpucluster.aws.guardrail_spend",
    "gpucluster.aws.guardrail_state", "gpucluster.aws.guardrails", "gpucluster.aws.health",
    "gpucluster.aws.iam", "gpucluster.aws.images", "gpucluster.aws.network", "gpucluster.aws.nics",
    "gpucluster.aws.nodes", "gpucluster.aws.nodescripts", "gpucluster.aws.observability",
    "gpucluster.aws.sdk", "gpucluster.aws.settings", "gpucluster.catalog", "gpucluster.catalog.eks",
    "gpucluster.cli", "gpucluster.cli.common", "gpucluster.cli.entry", "gpucluster.cli.planning",
    "gpucluster.cli.render", "gpucluster.conformance", "gpucluster.conformance.cfnschema",
    "gpucluster.conformance.crdschema", "gpucluster.conformance.findings",
    "gpucluster.conformance.sdktypes", "gpucluster.costdiff", "gpucluster.eks", "gpucluster.eks.crds",
    "gpucluster.fleet", "gpucluster.fleet.deployment", "gpucluster.fleet.jobnames",
    "gpucluster.fleet.nodepaths", "gpucluster.fleet.tags", "gpucluster.guardcost", "gpucluster.ledger",
    "gpucluster.names", "gpucluster.node", "gpucluster.node.bake", "gpucluster.node.bundle",
    "gpucluster.node.metrics", "gpucluster.node.multipart", "gpucluster.node.userdata",
    "gpucluster.noderole", "gpucluster.parts", "gpucluster.plan", "gpucluster.policy",
    "gpucluster.policy.cloudcontrol", "gpucluster.policy.offline", "gpucluster.policy.records",
    "gpucluster.policy.rules", "gpucluster.policy.rules.buckets", "gpucluster.policy.rules.capacity",
    "gpucluster.policy.rules.efa", "gpucluster.policy.rules.eks", "gpucluster.policy.rules.groups",
    "gpucluster.policy.rules.guardrails", "gpucluster.policy.rules.iam", "gpucluster.policy.rules.network",
    "gpucluster.policy.rules.nodes", "gpucluster.policy.rules.pcs", "gpucluster.policy.rules.registry",
    "gpucluster.policy.rules.tagging", "gpucluster.policy.rules.tokens", "gpucluster.policy.settings",
    "gpucluster.preflight", "gpucluster.pricing", "gpucluster.program", "gpucluster.project",
    "gpucluster.schedule", "gpucluster.spec", "gpucluster.spec.autostop", "gpucluster.spec.budget",
    "gpucluster.spec.checks", "gpucluster.spec.datasets", "gpucluster.spec.decode",
    "gpucluster.spec.fields", "gpucluster.spec.files", "gpucluster.spec.findings", "gpucluster.spec.images",
    "gpucluster.spec.models", "gpucluster.spec.network", "gpucluster.spec.node_groups",
    "gpucluster.spec.notifications", "gpucluster.spec.observability", "gpucluster.spec.scheduler",
    "gpucluster.stack", "gpucluster.stackfile", "gpucluster.subnets", "gpucluster.warmpool",
})


def test_plan_loads_no_module_of_a_feature_the_stack_does_not_use() -> None:
    """Issue 38: a plan of dev (no observability, no Slurm, no EKS) loaded the Grafana provisioner, its HTTP
    client and the dashboards' renderer through `dashboards` and `aws.prometheus`; none of them now, nor the
    other commands' modules (job backends, capacity, images: `cli.entry` imports the invoked one only), and
    the gpucluster modules it loads are the pinned ones."""
    done = subprocess.run([sys.executable, "-c", PLAN_DEV_FEATURES], cwd=REPO, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "[] True"
    loaded = set(json.loads(done.stderr.strip().splitlines()[-2]))
    assert (sorted(loaded - DEV_PLAN_MODULES), sorted(DEV_PLAN_MODULES - loaded)) == ([], []), \
        "(new on a plan of dev, no longer loaded): update DEV_PLAN_MODULES or move the import"
    assert not any(m.startswith("gpucluster.ops") for m in loaded), "no day-2 operation on a plan's path"
