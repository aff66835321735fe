"""Policy pack config in Pulumi's format: levels, properties, and the errors a typo gets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpucluster.policy import settings
from gpucluster.policy.rules import RULES, rules_by_name
from gpucluster.policy.settings import PolicyConfigError, load, resolve


def test_levels_and_properties() -> None:
    levels, given = resolve({
        "all": "advisory",
        "efa-wiring": "mandatory",
        "environment-limits": {"enforcementLevel": "disabled", "fallback_environment": "staging"},
        "required-cost-tags": {"required_tags": ["owner", "team"]},
    })
    assert levels == {**dict.fromkeys((r.name for r in RULES), "advisory"),
                      "efa-wiring": "mandatory", "environment-limits": "disabled"}
    assert given["environment-limits"] == {"fallback_environment": "staging"}
    assert rules_by_name()["required-cost-tags"].settings(given["required-cost-tags"]) == {
        "required_tags": ["owner", "team"]}


def test_environment_overrides_merge_per_environment() -> None:
    _, given = resolve({"environment-limits": {"environments": {"dev": {"max_gpus": 4.0}}}})
    merged = rules_by_name()["environment-limits"].settings(given["environment-limits"])
    assert merged["environments"]["dev"] == {"max_gpus": 4.0}
    assert merged["environments"]["prod"]["max_gpus"] == 512


INVALID: list[tuple[Any, str]] = [
    ([], "the policy config must be a JSON object keyed by policy name"),
    ({"all": "loud"}, "all: enforcement level must be one of mandatory, advisory, remediate, disabled, "
                      "got 'loud'"),
    ({"s3-encrypton": "mandatory"}, "s3-encrypton: unknown policy; did you mean 's3-encryption'?"),
    ({"efa-wiring": 3}, "efa-wiring: must be an enforcement level or an object, got 3"),
    ({"efa-wiring": {"strict": True}}, "efa-wiring.strict: unknown property (none are taken here)"),
    ({"environment-limits": {"environments": {"dev": {"max_gpu": 4}}}},
     "environment-limits.environments.dev.max_gpu: unknown property; did you mean 'max_gpus'?"),
    ({"environment-limits": {"environments": {"dev": {"max_gpus": -1}}}},
     "environment-limits.environments.dev.max_gpus: must be >= 0, got -1"),
    ({"environment-limits": {"environments": {"dev": {"max_gpus": 2.5}}}},
     "environment-limits.environments.dev.max_gpus: must be an integer, got 2.5"),
    ({"environment-limits": {"environments": {"dev": {"spot_only": "yes"}}}},
     "environment-limits.environments.dev.spot_only: must be a boolean, got 'yes'"),
    ({"environment-limits": {"environments": {"dev": {"allowed_instance_types": ["g5.*", 5]}}}},
     "environment-limits.environments.dev.allowed_instance_types[1]: must be a string, got 5"),
    ({"required-cost-tags": {"required_tags": "owner"}},
     "required-cost-tags.required_tags: must be an array, got 'owner'"),
]


@pytest.mark.parametrize(("document", "problem"), INVALID, ids=[p for _, p in INVALID])
def test_invalid_config_names_the_problem(document: Any, problem: str) -> None:
    with pytest.raises(PolicyConfigError) as caught:
        resolve(document)
    assert caught.value.problems == [problem]


def test_load_prefixes_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "c.json"
    bad.write_text("{not json")
    with pytest.raises(PolicyConfigError, match=r"c\.json: not valid JSON"):
        load(bad)
    with pytest.raises(PolicyConfigError, match=r"nope\.json: no such policy config file"):
        load(tmp_path / "nope.json")


def test_shipped_stack_configs_are_valid() -> None:
    shipped = sorted(settings.policy_config_dir().glob("*.json"))
    assert "prod.json" in [p.name for p in shipped]
    for path in shipped:  # a new stack's config (policies/config/<stack>.json) is checked the same way
        load(path)
    levels, given = load(settings.policy_config_dir() / "prod.json")
    assert levels == {"environment-limits": "mandatory"}
    prod = settings.policy_config_dir() / "prod.json"
    assert json.loads(prod.read_text())["environment-limits"]["environments"]["prod"]["max_gpus"] == 256
    assert given["environment-limits"]["environments"]["prod"]["spot_only"] is False


def test_stack_config_path() -> None:
    assert settings.stack_config_path("prod") == settings.policy_config_dir() / "prod.json"
    assert settings.policy_config_dir() == Path(__file__).resolve().parents[2] / "policies" / "config"
    assert settings.stack_config_path("dev") is None
    # keyed by environment: a second prod-like stack shares prod.json; a stack's own file wins
    assert settings.stack_config_path("prod-eu", "prod") == settings.policy_config_dir() / "prod.json"
    assert settings.stack_config_path("prod", "staging") == settings.policy_config_dir() / "prod.json"
    assert settings.stack_config_path("qa", "qa") is None


def test_a_second_prod_stack_gets_prods_limits_from_its_environment(tmp_path: Path) -> None:
    """prod.json caps prod at 256 GPUs (the built-in prod limit is 512): a stack named prod-eu tagged
    environment: prod is held to 256 too, with no file of its own."""
    from typer.testing import CliRunner

    from gpucluster.cli import app

    repo = Path(__file__).resolve().parents[2]
    prod = (repo / "stacks" / "Pulumi.prod.yaml").read_text()
    big = tmp_path / "Pulumi.prod-eu.yaml"
    big.write_text(prod.replace("max_nodes: 16", "max_nodes: 40"))
    assert big.read_text() != prod
    result = CliRunner().invoke(app, ["plan", str(big), "--json"])
    document = json.loads(result.stdout)
    limits = [v for v in document["violations"] if v["policy"] == "environment-limits"]
    assert limits and "over the prod limit of 256" in limits[0]["message"], document["violations"]
