"""Prices in every region (issue 35, item 4): the AWS Price List behind the spend guard, the project's price
file that `gpucluster catalog prices` writes and `plan`, `cost` and `recommend` read, and the one line that
says how to get a region's prices where there are none."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from botocore.exceptions import ClientError
from botocore.stub import Stubber
from typer.testing import CliRunner

from gpucluster import catalog, pricing, project, sizing
from gpucluster.cli import app
from gpucluster.cli.planning import guard_fetch_line
from gpucluster.fleet import awsapi
from gpucluster.fleet.accrual import ON_DEMAND, Instance, PriceError, Prices, instance_rates
from gpucluster.fleet.pricelist import (
    EC2_ON_DEMAND_LINUX,
    FallbackPrices,
    PriceCache,
    PriceListError,
    cached_lookup,
    instance_usd_per_hour,
)
from gpucluster.ops import pricelist as ops_pricelist
from gpucluster.preflight import parse_stack_config

runner = CliRunner()
NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)
REGIONS = {"eu-west-1": ["eu-west-1a", "eu-west-1b"],
           "ap-northeast-1": ["ap-northeast-1a", "ap-northeast-1c"],
           "us-east-2": ["us-east-2a", "us-east-2b"]}
# Made-up figures for the fakes below (not AWS's prices): what the tests check is where they go.
FAKE_USD = {"g5.xlarge": 1.25, "g6e.xlarge": 2.5}


def product(usd: float, unit: str = "Hrs", begin: str = "0") -> str:
    """A PriceList item as GetProducts answers it: a JSON document (the shape of fleet.pricelist)."""
    return json.dumps({"product": {"attributes": {}}, "terms": {"OnDemand": {"T.1": {"priceDimensions": {
        "T.1.2": {"unit": unit, "beginRange": begin, "pricePerUnit": {"USD": f"{usd}"}}}}}}})


def ec2_filters(region: str, instance_type: str) -> list[dict[str, str]]:
    values = {"regionCode": region, "instanceType": instance_type, **EC2_ON_DEMAND_LINUX}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in values.items()]


def ec2_request(region: str, instance_type: str, token: str | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"ServiceCode": "AmazonEC2", "Filters": ec2_filters(region, instance_type),
                               "FormatVersion": "aws_v1", "MaxResults": 100}
    if token:
        request["NextToken"] = token
    return request


@pytest.fixture
def pricing_stub() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("pricing", region_name="eu-central-1", aws_access_key_id="x",
                          aws_secret_access_key="x")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


@pytest.fixture
def dynamodb_stub() -> Iterator[tuple[Any, Stubber]]:
    client = boto3.client("dynamodb", region_name="eu-west-1", aws_access_key_id="x",
                          aws_secret_access_key="x")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


@pytest.fixture(autouse=True)
def no_price_file() -> Iterator[None]:
    """Every test starts and ends without a project price file (the overlay is process-wide)."""
    catalog.use_price_file(None)
    yield
    catalog.use_price_file(None)


# ------------------------------------------------------------------------- the Price List query


def test_the_price_list_answers_at_its_three_endpoints_only() -> None:
    """botocore's endpoints.json lists api.pricing in us-east-1, eu-central-1 and ap-south-1."""
    endpoints = boto3.session.Session().get_available_regions("pricing")
    assert sorted(endpoints) == ["ap-south-1", "eu-central-1", "us-east-1"]
    assert {awsapi.pricing_region(r) for r in ("eu-west-1", "me-south-1", "il-central-1")} == {"eu-central-1"}
    assert awsapi.pricing_region("ap-northeast-1") == "ap-south-1"
    assert {awsapi.pricing_region(r) for r in ("us-east-2", "ca-central-1", "sa-east-1")} == {"us-east-1"}


def test_botocores_model_takes_the_filters_the_query_sends() -> None:
    model = boto3.client("pricing", region_name="us-east-1").meta.service_model
    shape = model.operation_model("GetProducts").input_shape
    assert {"ServiceCode", "Filters", "FormatVersion", "NextToken", "MaxResults"} <= set(shape.members)
    kinds = model.shape_for("FilterType").enum
    assert "TERM_MATCH" in kinds and "CONTAINS" in kinds


def test_an_instance_price_reads_every_page(pricing_stub: tuple[Any, Stubber]) -> None:
    client, stub = pricing_stub
    stub.add_response("get_products", {"PriceList": [], "NextToken": "n1"},
                      ec2_request("eu-west-1", "g5.xlarge"))
    stub.add_response("get_products", {"PriceList": [product(1.25), product(0.0)]},
                      ec2_request("eu-west-1", "g5.xlarge", "n1"))
    assert instance_usd_per_hour(client, "eu-west-1", "g5.xlarge") == 1.25


def test_no_product_is_no_price(pricing_stub: tuple[Any, Stubber]) -> None:
    client, stub = pricing_stub
    stub.add_response("get_products", {"PriceList": []}, ec2_request("us-east-2", "p5.48xlarge"))
    assert instance_usd_per_hour(client, "us-east-2", "p5.48xlarge") is None


def test_two_products_answer_the_higher_price(pricing_stub: tuple[Any, Stubber]) -> None:
    """The guard errs towards stopping early, never late."""
    client, stub = pricing_stub
    stub.add_response("get_products", {"PriceList": [product(1.0), product(1.5)]},
                      ec2_request("eu-west-1", "g5.xlarge"))
    assert instance_usd_per_hour(client, "eu-west-1", "g5.xlarge") == 1.5


@pytest.mark.parametrize("item", ["not json", json.dumps({"terms": {"OnDemand": {"T": {"priceDimensions": {
    "D": {"unit": "Hrs", "pricePerUnit": {"USD": "free"}}}}}}}), json.dumps([1, 2])])
def test_an_answer_that_is_not_a_price_is_an_error(pricing_stub: tuple[Any, Stubber], item: str) -> None:
    client, stub = pricing_stub
    stub.add_response("get_products", {"PriceList": [item]}, ec2_request("eu-west-1", "g5.xlarge"))
    with pytest.raises(PriceListError):
        instance_usd_per_hour(client, "eu-west-1", "g5.xlarge")


@pytest.mark.parametrize("code", ["ThrottlingException", "AccessDeniedException", "InternalErrorException"])
def test_price_list_faults_propagate(pricing_stub: tuple[Any, Stubber], code: str) -> None:
    client, stub = pricing_stub
    stub.add_client_error("get_products", code, expected_params=ec2_request("eu-west-1", "g5.xlarge"))
    with pytest.raises(ClientError):
        instance_usd_per_hour(client, "eu-west-1", "g5.xlarge")


# ------------------------------------------------------------------------ the guard's cache


def cache_key(region: str, instance_type: str) -> dict[str, Any]:
    return {"stack": {"S": "org/proj/dev/test"}, "group": {"S": f"price#{region}#{instance_type}"}}


def test_a_fresh_cached_price_asks_no_price_list(dynamodb_stub: tuple[Any, Stubber],
                                                 pricing_stub: tuple[Any, Stubber]) -> None:
    db, db_stub = dynamodb_stub
    db_stub.add_response("get_item", {"Item": {**cache_key("eu-west-1", "g5.xlarge"),
                                               "usd_per_hour": {"N": "1.25"},
                                               "fetched_at": {"S": (NOW - timedelta(days=3)).isoformat()}}},
                         {"TableName": "state", "Key": cache_key("eu-west-1", "g5.xlarge")})
    lookup = cached_lookup(pricing_stub[0], PriceCache(db, "state", "org/proj/dev/test"), "eu-west-1", NOW)
    assert lookup("g5.xlarge") == 1.25


def test_a_stale_or_missing_price_is_fetched_and_cached(dynamodb_stub: tuple[Any, Stubber],
                                                        pricing_stub: tuple[Any, Stubber]) -> None:
    db, db_stub = dynamodb_stub
    client, stub = pricing_stub
    key = cache_key("eu-west-1", "g5.xlarge")
    db_stub.add_response("get_item", {"Item": {**key, "usd_per_hour": {"N": "1.0"},
                                               "fetched_at": {"S": (NOW - timedelta(days=31)).isoformat()}}},
                         {"TableName": "state", "Key": key})
    stub.add_response("get_products", {"PriceList": [product(1.25)]}, ec2_request("eu-west-1", "g5.xlarge"))
    db_stub.add_response("put_item", {}, {"TableName": "state", "Item": {
        **key, "usd_per_hour": {"N": "1.25"}, "fetched_at": {"S": NOW.isoformat()}}})
    lookup = cached_lookup(client, PriceCache(db, "state", "org/proj/dev/test"), "eu-west-1", NOW)
    assert lookup("g5.xlarge") == 1.25


def test_a_cache_fault_still_prices_from_the_price_list(dynamodb_stub: tuple[Any, Stubber],
                                                        pricing_stub: tuple[Any, Stubber]) -> None:
    db, db_stub = dynamodb_stub
    client, stub = pricing_stub
    db_stub.add_client_error("get_item", "ProvisionedThroughputExceededException")
    stub.add_response("get_products", {"PriceList": [product(1.25)]}, ec2_request("eu-west-1", "g5.xlarge"))
    db_stub.add_client_error("put_item", "AccessDeniedException")
    assert cached_lookup(client, PriceCache(db, "state", "s"), "eu-west-1", NOW)("g5.xlarge") == 1.25


def test_the_guard_prices_a_type_its_table_lacks_once(pricing_stub: tuple[Any, Stubber]) -> None:
    client, stub = pricing_stub
    stub.add_response("get_products", {"PriceList": [product(1.25)]}, ec2_request("eu-west-1", "g5.xlarge"))
    stub.add_response("get_products", {"PriceList": []}, ec2_request("eu-west-1", "g6e.xlarge"))
    table = FallbackPrices({"p4d.24xlarge": 30.0}, cached_lookup(client, None, "eu-west-1", NOW))
    prices = Prices(on_demand=table)
    one = Instance("i-1", "g5.xlarge", ON_DEMAND, NOW - timedelta(hours=1), "gpu")
    assert instance_rates([one, one], prices, {}) == {"i-1": 1.25}           # asked once
    assert prices.gone_rate("gpu") == 30.0                                     # rendered and fetched
    lost = Instance("i-2", "g6e.xlarge", ON_DEMAND, NOW, "gpu")
    for _ in range(2):                                            # asked once, then known missing
        with pytest.raises(PriceError, match=r"no on-demand price for g6e\.xlarge"):
            instance_rates([lost], prices, {})


def test_the_spend_guard_handler_looks_up_through_the_price_list(monkeypatch: pytest.MonkeyPatch,
                                                                 pricing_stub: tuple[Any, Stubber]) -> None:
    from gpucluster.fleet.runtime import RUNTIME
    from gpucluster.lambdas import spend_guard

    client, stub = pricing_stub
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.delenv("GUARD_STATE_TABLE", raising=False)
    monkeypatch.setattr(RUNTIME, "client", lambda service: {"pricing": client}[service])
    stub.add_client_error("get_products", "ThrottlingException",
                          expected_params=ec2_request("eu-west-1", "g5.xlarge"))
    prices = spend_guard.with_price_list(Prices(on_demand={}), "s", NOW)
    with pytest.raises(ClientError):                  # fails the invocation: the retry asks again
        prices.on_demand.get("g5.xlarge")


def test_the_spend_guard_role_may_ask_the_price_list_and_nothing_more() -> None:
    """pricing:GetProducts has no resource types (cfn-lint's Service Authorization data): Resource "*"."""
    from cfnlint_data import service_authorization

    service = service_authorization()["pricing"]
    assert service["Resources"] == {} and service["Actions"]["getproducts"] == {}
    from gpucluster.aws.guardrail_spend import SPEND_GUARD_READS
    from gpucluster.fleet.deployment import IAM_ACTIONS

    assert "pricing:GetProducts" in SPEND_GUARD_READS and "pricing:GetProducts" in IAM_ACTIONS["spend_guard"]
    assert not any(a.startswith("pricing:") for k, v in IAM_ACTIONS.items() if k != "spend_guard" for a in v)
    assert [a for a in SPEND_GUARD_READS if a.startswith("pricing:")] == ["pricing:GetProducts"]


# --------------------------------------------------------------------- the project's price file


class FakePriceList:
    """GetProducts over made-up figures: an instance type's price by its filter, every service price 0.5."""

    def __init__(self, prices: dict[str, float]) -> None:
        self.prices, self.calls = prices, 0

    def get_products(self, **kwargs: Any) -> dict[str, Any]:
        self.calls += 1
        fields = {f["Field"]: f["Value"] for f in kwargs["Filters"]}
        if kwargs["ServiceCode"] == "AmazonEC2" and "instanceType" in fields:
            usd = self.prices.get(fields["instanceType"])
            return {"PriceList": [product(usd)] if usd else []}
        queries = (*ops_pricelist.SERVICE_QUERIES.values(), *ops_pricelist.FSX_QUERIES.values())
        unit = next(q.unit for q in queries
                    if q.service == kwargs["ServiceCode"] and fields.get("usagetype", "") == q.usage_contains
                    and all(fields.get(k) == v for k, v in q.attributes.items()))
        return {"PriceList": [product(0.5, unit), product(0.25, unit, "2000000000")]}


def write_region_file(tmp_path: Path, region: str) -> Path:
    (tmp_path / "Pulumi.yaml").write_text("name: demo\nruntime: python\n")
    found = ops_pricelist.fetch_region_prices(FakePriceList(FAKE_USD), region, NOW)
    return ops_pricelist.write_price_file(project.price_file_path(tmp_path), found)


def test_catalog_prices_fetches_every_offered_type_and_the_service_prices(tmp_path: Path) -> None:
    found = ops_pricelist.fetch_region_prices(FakePriceList(FAKE_USD), "eu-west-1", NOW)
    assert found.on_demand_usd_per_hour == {"g5.xlarge": 1.25}
    assert "p4d.24xlarge" in found.unpriced_types and not found.missing_services
    assert found.services["amp_ingest_usd_per_10m_samples"] == 0.5e7               # per 10 million samples
    assert found.services["amp_ingest_usd_per_10m_samples_over_2b"] == 0.25e7      # the second tier
    assert set(found.services["fsx_lustre_usd_per_gb_month"]) == set(ops_pricelist.FSX_QUERIES)
    path = tmp_path / catalog.PRICE_FILE_NAME
    ops_pricelist.write_price_file(path, found)
    ops_pricelist.write_price_file(
        path, ops_pricelist.fetch_region_prices(FakePriceList(FAKE_USD), "us-east-2", NOW))
    regions = yaml.safe_load(path.read_text())["regions"]
    assert set(regions) == {"eu-west-1", "us-east-2"}                               # merged, not replaced
    assert regions["eu-west-1"]["as_of"] == "2026-11-29"


def test_a_region_the_price_list_cannot_price_is_one_error() -> None:
    with pytest.raises(ops_pricelist.PriceListUnavailable, match="no on-demand price in eu-west-1"):
        ops_pricelist.fetch_region_prices(FakePriceList({}), "eu-west-1", NOW)


def test_a_missing_service_price_leaves_the_services_out(tmp_path: Path) -> None:
    class Partial(FakePriceList):
        def get_products(self, **kwargs: Any) -> dict[str, Any]:
            if kwargs["ServiceCode"] == "AmazonGrafana":
                return {"PriceList": []}
            return super().get_products(**kwargs)

    found = ops_pricelist.fetch_region_prices(Partial(FAKE_USD), "eu-west-1", NOW)
    assert found.missing_services == ["amg_editor_usd_per_month", "amg_viewer_usd_per_month"]
    assert "services" not in found.entry()


def test_catalog_prices_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: demo\nruntime: python\n")
    monkeypatch.chdir(tmp_path)
    fake = FakePriceList(FAKE_USD)
    monkeypatch.setattr(ops_pricelist, "pricing_client", lambda region: fake)
    result = runner.invoke(app, ["catalog", "prices", "--region", "ap-northeast-1"])
    assert result.exit_code == 0, result.output
    written = tmp_path / catalog.PRICE_FILE_NAME
    assert result.output.startswith(f"{written}: 2 GPU types priced in ap-northeast-1")
    for args, message in ((["--region", "us-east-1"], "the catalog carries us-east-1's prices already"),
                          (["--region", "xx-nowhere-1"], "'xx-nowhere-1' is not a region the catalog knows")):
        bad = runner.invoke(app, ["catalog", "prices", *args])
        assert bad.exit_code == 2 and bad.output.count("\n") == 1 and message in bad.output


# ------------------------------------------------------------ a stack in each region, with and without


def region_config(base_config: dict[str, Any], region: str) -> dict[str, Any]:
    config = {**base_config, "aws:region": region}
    config["gpucluster:network"] = {**config["gpucluster:network"], "availability_zones": REGIONS[region]}
    group = {**config["gpucluster:node_groups"][0], "instance_types": ["g5.xlarge"]}
    config["gpucluster:node_groups"] = [group]
    config["gpucluster:budget"] = {"monthly_limit_usd": 1000, "action_threshold_percent": 100}
    return config


@pytest.mark.parametrize("region", sorted(REGIONS))
def test_without_prices_each_command_says_in_one_line_how_to_get_them(
        region: str, base_config: dict[str, Any], write_stack: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    stack = write_stack(region_config(base_config, region))
    how = (f"`gpucluster catalog prices --region {region}` (AWS credentials) writes them to "
           "gpucluster-prices.yaml")
    cost = runner.invoke(app, ["cost", str(stack)])
    assert cost.exit_code == 2 and cost.output.count("\n") == 1 and how in cost.output, cost.output
    recommend = runner.invoke(app, ["recommend", "--params", "7", "--mode", "inference",
                                    "--region", region])
    # Said once: as the one line of exit 2, or, where a type sold only as Capacity Blocks is priced
    # at its block rate anyway (p5e in us-east-2), as the one line naming the types left out.
    assert " ".join(recommend.output.split()).count(how) == 1, recommend.output
    assert (recommend.exit_code == 2 and recommend.output.count("\n") == 1) or recommend.exit_code == 0
    spec = parse_stack_config(region_config(base_config, region), stack="t")
    assert pricing.guard_prices(spec)["on_demand"] == {}
    line = guard_fetch_line(spec)
    assert line is not None and how in line
    assert line.startswith(f"spend guard: no price rendered for g5.xlarge in {region}: it asks the AWS Price "
                           "List at run time")


@pytest.mark.parametrize("region", sorted(REGIONS))
def test_with_the_price_file_each_command_prices(region: str, base_config: dict[str, Any], write_stack: Any,
                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_region_file(tmp_path, region)
    monkeypatch.chdir(tmp_path)
    stack = write_stack(region_config(base_config, region))
    cost = runner.invoke(app, ["cost", str(stack), "--json"])
    assert cost.exit_code == 0, cost.output
    group = json.loads(cost.output)["node_groups"][0]
    assert group["rates"]["on_demand"]["usd_per_hour"] == 1.25
    assert group["rates"]["on_demand"]["source"] == (
        "AWS Price List API (pricing:GetProducts) (gpucluster-prices.yaml)")
    recommend = runner.invoke(app, ["recommend", "--params", "7", "--mode", "inference",
                                    "--region", region, "--json"])
    assert recommend.exit_code == 0, recommend.output
    doc = json.loads(recommend.output)
    on_demand = {f["instance_type"] for f in doc["fits"] if f["price_basis"] != "capacity block"}
    assert on_demand and on_demand <= set(FAKE_USD)
    assert "g5.xlarge" not in doc["unpriced_types"]
    project.use_project_prices(tmp_path)
    spec = parse_stack_config(region_config(base_config, region), stack="t")
    assert pricing.guard_prices(spec)["on_demand"] == {"g5.xlarge": 1.25}
    assert pricing.guard_prices(spec)["fixed_usd_per_hour"] > 0
    assert guard_fetch_line(spec) is None


def test_recommend_leaves_an_unpriced_type_out_and_says_so_once(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    write_region_file(tmp_path, "eu-west-1")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["recommend", "--params", "7", "--mode", "inference",
                                 "--region", "eu-west-1"])
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if line.startswith("recommend: left out, no price")]
    assert len(said) == 1 and "p4d.24xlarge" in said[0] and "g5.xlarge" not in said[0]
    project.use_project_prices(tmp_path)
    assert "p4d.24xlarge" in sizing.unpriced_types("eu-west-1")
    train = sizing.make_workload(model="llama-3.1-70b", mode="train")
    assert all(f.instance_type != "p4d.24xlarge" for f in sizing.recommend(train, "eu-west-1"))


def test_plan_says_when_the_guard_would_fetch_prices(base_config: dict[str, Any], write_stack: Any,
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    stack = write_stack(region_config(base_config, "eu-west-1"))
    result = runner.invoke(app, ["plan", str(stack)])
    assert "spend guard: no price rendered for g5.xlarge in eu-west-1: it asks the AWS Price List" in \
        " ".join(result.output.split()), result.output


def test_a_broken_price_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "Pulumi.yaml").write_text("name: demo\nruntime: python\n")
    (tmp_path / catalog.PRICE_FILE_NAME).write_text("- just a list\n")
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["recommend", "--params", "7", "--mode", "inference",
                                 "--region", "eu-west-1"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "not a price file" in result.output
