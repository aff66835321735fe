"""The ledger of facts mocks cannot check (issue 33 item 2): every marker cites an entry, each entry is cited.

A fact written from memory ("from memory", "unverified", "not re-checked", ...) is honest only if it
is findable: each such marker in the code, the infrastructure and the docs carries `ledger: <id>` on
its line, every cited id is an entry of catalog/data/ledger.yaml, and every entry is cited somewhere
(no orphan either way). `plan` names the unverified entries the planned stack relies on, as one line
and under `unverified_facts` in `--json`. The scanner runs on small trees in tmp_path too, so none of
its checks can pass for want of finding anything.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from base_config import base, policy_clean
from gpucluster import ledger
from gpucluster.cli import app
from gpucluster.preflight import parse_stack_config

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("components", "infra", "docs", "examples", "policies", "stacks", "benchmarks", "README.md")
"""Where the code, the infrastructure and the docs live (tests/ describe markers, they are none)."""
LEDGER_OWN = (ledger.LEDGER_FILE, Path(ledger.__file__), REPO / "docs" / "reference" / "ledger.md")
"""The ledger itself: its statuses and texts name what the markers mark."""
TEXT = (".py", ".md", ".yaml", ".yml", ".sh", ".tmpl", ".json", ".txt", ".toml", ".cfg")
MARKER = re.compile(r"\b(?:from memory|unverified|not verified|re-checked|not been checked"
                    r"|not checked (?:here|on|against|from|in)|to check on a)\b", re.IGNORECASE)
"""How the code says a fact is unchecked (doctor's runtime "could not check" is an outcome, not a fact)."""
REFERENCE = re.compile(r"ledger: ([a-z0-9][a-z0-9-]*)")
KEBAB = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


def text_files(root: Path, parts: tuple[str, ...]) -> Iterator[Path]:
    for part in parts:
        path = root / part
        candidates = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for file in candidates:
            if (file.is_file() and file.suffix in TEXT and ".venv" not in file.parts
                    and "__pycache__" not in file.parts and file.resolve() not in own_files()):
                yield file


def own_files() -> set[Path]:
    return {p.resolve() for p in LEDGER_OWN}


def scan(root: Path, parts: tuple[str, ...], ids: set[str]) -> tuple[list[str], list[str], set[str]]:
    """(markers without a reference, references to unknown ids, the ids cited) under `root`."""
    bare, unknown, cited = [], [], set()
    for file in text_files(root, parts):
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            where = f"{file.relative_to(root)}:{number}: {line.strip()}"
            refs = REFERENCE.findall(line)
            cited.update(refs)
            if (MARKER.search(line) and not refs) or re.search(r"\bledger:\s*$", line):
                bare.append(where)  # a marker uncited, or a citation whose id wrapped to the next line
            unknown += [f"{where} (no entry {ref!r})" for ref in refs if ref not in ids]
    return bare, unknown, cited


@pytest.fixture(scope="module")
def entries() -> tuple[ledger.Entry, ...]:
    return ledger.load_ledger()


@pytest.fixture(scope="module")
def repo_scan(entries: tuple[ledger.Entry, ...]) -> tuple[list[str], list[str], set[str]]:
    return scan(REPO, SCANNED, {e.id for e in entries})


# ------------------------------------------------------------------------- the repository


def test_every_marker_of_an_unchecked_fact_cites_a_ledger_entry(repo_scan: Any) -> None:
    bare, _, _ = repo_scan
    assert not bare, "a marker without `ledger: <id>` on its line:\n" + "\n".join(bare)


def test_every_cited_id_is_an_entry(repo_scan: Any) -> None:
    _, unknown, _ = repo_scan
    assert not unknown, "\n".join(unknown)


def test_every_entry_is_cited(repo_scan: Any, entries: tuple[ledger.Entry, ...]) -> None:
    _, _, cited = repo_scan
    orphans = sorted({e.id for e in entries} - cited)
    assert not orphans, f"ledger entries nothing cites: {orphans}"


def test_every_entry_is_complete_and_honest(entries: tuple[ledger.Entry, ...]) -> None:
    assert len(entries) >= 17
    for e in entries:
        assert KEBAB.fullmatch(e.id) and len(e.id) <= 40, e.id
        assert e.says.strip() and e.source.strip(), e.id
        if e.status == "documented":  # a named source, not a recollection
            assert not re.search(r"from memory|^none", e.source, re.IGNORECASE), e.id
        if e.status == "measured":
            assert re.search(r"measured in an account on \d{4}-\d{2}-\d{2}", e.source), e.id
        assert e.verify or e.recheck, f"{e.id}: neither verify nor a person can check it"


@pytest.mark.parametrize(("change", "says"), [
    ({"status": "guessed"}, "status must be one of documented, measured, unverified"),
    ({"when": ["slurm", "kubernetes"]}, "when must be a non-empty list of always, slurm"),
    ({"when": []}, "when must be a non-empty list"),
    ({"colour": "red"}, "unknown keys ['colour']"),
])
def test_a_malformed_entry_is_refused_naming_it(tmp_path: Path, change: dict[str, Any], says: str) -> None:
    entry = {"id": "x-fact", "says": "s", "source": "none", "status": "unverified", "when": ["slurm"],
             "verify": None, **change}
    path = tmp_path / "ledger.yaml"
    path.write_text(yaml.safe_dump({"entries": [entry]}))
    with pytest.raises(ledger.LedgerError, match=re.escape(says)) as err:
        ledger.load_ledger(path)
    assert "'x-fact'" in str(err.value)


def test_a_duplicate_id_is_refused(tmp_path: Path) -> None:
    entry = {"id": "x-fact", "says": "s", "source": "none", "status": "unverified", "when": ["always"]}
    path = tmp_path / "ledger.yaml"
    path.write_text(yaml.safe_dump({"entries": [entry, entry]}))
    with pytest.raises(ledger.LedgerError, match="duplicate ids"):
        ledger.load_ledger(path)


# ------------------------------------------------------------------------- the scanner itself


def test_the_scanner_finds_a_bare_marker_an_unknown_id_and_what_is_cited(tmp_path: Path) -> None:
    (tmp_path / "components").mkdir()
    (tmp_path / "components" / "a.py").write_text(
        "PORT = 1  # from memory\n"
        "PORTS = 2  # srun's range (ledger: known-fact)\n"
        "X = 3  # Not re-checked, ledger: gone-fact\n"
        "Y = 4  # wrapped (ledger:\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "g.md").write_text("This is unverified here.\nFine (ledger: other-fact).\n")
    bare, unknown, cited = scan(tmp_path, ("components", "docs"), {"known-fact", "other-fact"})
    assert bare == ["components/a.py:1: PORT = 1  # from memory",
                    "components/a.py:4: Y = 4  # wrapped (ledger:", "docs/g.md:1: This is unverified here."]
    assert unknown == ["components/a.py:3: X = 3  # Not re-checked, ledger: gone-fact (no entry 'gone-fact')"]
    assert cited == {"known-fact", "gone-fact", "other-fact"}


# ------------------------------------------------------------------------- which stacks rely on what


def spec_of(config: dict[str, Any]) -> Any:
    return parse_stack_config(config, stack="t")


def slurm(config: dict[str, Any], **scheduler: Any) -> dict[str, Any]:
    config["gpucluster:scheduler"] = {"type": "slurm", "ami_id": "ami-0abc12345def67890", **scheduler}
    return config


def changed(spec: Any, section: str, **values: Any) -> Any:
    """`spec` with `section` (a top-level model) changed: the conditions read fields, not findings."""
    return spec.model_copy(update={section: getattr(spec, section).model_copy(update=values)})


def group_changed(spec: Any, **values: Any) -> Any:
    [group] = spec.node_groups
    return spec.model_copy(update={"node_groups": [group.model_copy(update=values)]})


def test_each_condition_holds_for_the_stacks_that_have_it_and_only_them() -> None:
    on_demand = base()
    on_demand["gpucluster:node_groups"][0]["capacity"] = {}
    plain = spec_of(on_demand)
    assert {term for term, holds in ledger.CONDITIONS.items() if holds(plain)} == {"always"}
    [group] = plain.node_groups
    observed = changed(plain, "observability", prometheus=plain.observability.prometheus.model_copy(
        update={"enabled": True}))
    cases = {
        "slurm": spec_of(slurm(base(), accounting=False)),
        "slurm_accounting": spec_of(slurm(base())),
        "eks": spec_of({**base(), "gpucluster:scheduler": {"type": "eks"}}),
        "baked": changed(plain, "images", bake=True),
        "prometheus": observed,
        "grafana": changed(observed, "observability", grafana=plain.observability.grafana.model_copy(
            update={"enabled": True})),
        "mig": group_changed(plain, mig=object()),
        "spot": spec_of(base()),
        "capacity_block": group_changed(plain, capacity=group.capacity.model_copy(
            update={"market": "capacity_block"})),
        "no_nat": changed(plain, "network", nat_gateway=False),
        "warm_pool": group_changed(plain, warm_pool=object()),
        "fsx_existing_bucket": plain.model_copy(
            update={"datasets": [SimpleNamespace(existing=True, fsx=object())]}),
    }
    cases["guard_state"] = changed(plain, "autostop", enabled=True)
    cases["eks"] = changed(plain, "scheduler", type="eks")
    cases["price_list"] = plain.model_copy(update={"region": "eu-west-1"})
    cases["autostop"] = cases["guard_state"]
    budgeted = base()
    budgeted["gpucluster:node_groups"][0]["capacity"] = {}
    budgeted["gpucluster:budget"] = {"monthly_limit_usd": 1000, "action_threshold_percent": 100}
    budgeted["gpucluster:autostop"] = {"enabled": False}
    cases["spend_guard"] = spec_of(budgeted)
    budgeted["gpucluster:budget"] = {"monthly_limit_usd": 1000}
    assert not ledger.CONDITIONS["spend_guard"](spec_of(budgeted))  # an alert-only budget: no spend guard
    assert set(cases) | {"always", "cli"} == set(ledger.CONDITIONS)
    assert not any(ledger.CONDITIONS["cli"](spec) for spec in (plain, *cases.values()))
    new_bucket = plain.model_copy(update={"datasets": [SimpleNamespace(existing=False, fsx=object())]})
    assert not ledger.CONDITIONS["fsx_existing_bucket"](new_bucket)
    for term, spec in cases.items():
        assert ledger.CONDITIONS[term](spec), term
        assert not ledger.CONDITIONS[term](plain), term
    assert not ledger.CONDITIONS["slurm_accounting"](cases["slurm"])
    assert "prometheus" in {t for t, holds in ledger.CONDITIONS.items() if holds(cases["grafana"])}


def test_a_slurm_stack_relies_on_the_pcs_facts_and_a_plain_one_on_none(entries: Any) -> None:
    facts = [f.id for f in ledger.unverified_facts(spec_of(slurm(base())))]
    assert "pcs-update-permissions" in facts and "slurm-dbd-port" in facts
    assert "amg-datasource-sigv4" not in facts and "dcgm-diag-mig" not in facts
    assert all(e.status == "unverified" for e in entries if e.id in facts)
    assert "pcs-launch-template-multipart" not in facts  # documented: not named
    without_accounting = [f.id for f in ledger.unverified_facts(spec_of(slurm(base(), accounting=False)))]
    assert set(facts) - set(without_accounting) == {"slurm-dbd-port"}
    assert ledger.unverified_facts(spec_of(base())) == []


def test_the_plan_line_names_every_fact_and_how_many_verify_checks() -> None:
    facts = [e for e in ledger.load_ledger() if e.id in ("pcs-prices", "slurm-dbd-port")]
    assert ledger.plan_line(facts) == (
        "unverified: 2 facts this stack relies on (pcs-prices, slurm-dbd-port): gpucluster verify checks "
        "1 of them after pulumi up; see docs/reference/ledger.md")


# ------------------------------------------------------------------------- plan


@pytest.fixture(scope="module")
def slurm_stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ledger") / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": policy_clean(slurm(base()))}, sort_keys=False))
    return path


def test_plan_names_the_unverified_facts_of_a_slurm_stack_in_one_line(slurm_stack: Path) -> None:
    expected = ledger.plan_line(ledger.unverified_facts(spec_of(policy_clean(slurm(base())))))
    result = CliRunner().invoke(app, ["plan", str(slurm_stack)])
    assert result.exit_code == 0, result.output
    out = result.output
    start = out.index("unverified: ")
    assert " ".join(out[start:].split()) == expected
    assert out.count("unverified: ") == 1


def test_plan_json_lists_them_under_unverified_facts(slurm_stack: Path) -> None:
    doc = json.loads(CliRunner().invoke(app, ["plan", str(slurm_stack), "--json"]).stdout)
    expected = ledger.unverified_facts(spec_of(policy_clean(slurm(base()))))
    assert doc["unverified_facts"] == [e.as_json() for e in expected]
    assert {"id", "says", "source", "verify"} == set(doc["unverified_facts"][0])


def test_a_stack_relying_on_none_prints_no_line_and_an_empty_list(tmp_path: Path) -> None:
    """A stack without stopping guardrails relies on no unverified fact (the policy pack asks every stack
    for a budget action and auto-stop: the guard-state table relies on dynamodb-kms-calls, the spend guard
    on Cost Explorer's answer and the prices of its calls, auto-stop on DescribeAlarms' grant: those alone
    are named for a plain stack that passes the pack)."""
    bare = base()
    bare.pop("gpucluster:budget", None)
    bare["gpucluster:autostop"] = {"enabled": False}
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": bare}, sort_keys=False))
    text = CliRunner().invoke(app, ["plan", str(path)])
    assert "unverified: " not in text.output, text.output
    assert json.loads(CliRunner().invoke(app, ["plan", str(path), "--json"]).stdout)["unverified_facts"] == []
    clean = tmp_path / "Pulumi.c.yaml"
    clean.write_text(yaml.safe_dump({"config": policy_clean(base())}, sort_keys=False))
    listed = json.loads(CliRunner().invoke(app, ["plan", str(clean), "--json"]).stdout)["unverified_facts"]
    # (Cost Explorer's $0.01 a request is documented, ce-request-price: not listed)
    assert [f["id"] for f in listed] == ["dynamodb-kms-calls", "ce-empty-answer-has-a-zero-row",
                                         "cloudwatch-describe-alarms-resource", "guard-api-prices"]


def test_the_pcs_name_limits_are_botocores() -> None:
    """pcs-group-and-queue-names, pcs-cluster-name-length: documented by the PCS API model itself."""
    import botocore.session

    from gpucluster.spec.scheduler import PCS_NAME_MIN

    shapes = botocore.session.get_session().get_service_model("pcs").shape_for
    for name, longest in (("ComputeNodeGroupName", 25), ("QueueName", 25), ("ClusterName", 40)):
        metadata = shapes(name).metadata
        assert (metadata["min"], metadata["max"]) == (PCS_NAME_MIN, longest), name
        assert metadata["pattern"] == "(?!pcs_)^[A-Za-z][A-Za-z0-9-]+", name
