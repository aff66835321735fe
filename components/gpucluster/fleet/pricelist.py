"""On-demand prices from the AWS Price List API, for a type the rendered price table lacks.

The spend guard prices with the table rendered at deploy (`accrual.Prices`); a type that table lacks
(a region the catalog carries no price for, a type added to a group by hand) is priced here:
`pricing:GetProducts` for the type's Linux, shared-tenancy, on-demand product in the region, the
answer cached in the guard-state table so that one call a type and a month is all it costs.
`gpucluster catalog prices` (ops.pricelist) asks the same query. No Pulumi, boto3 clients handed in.

Facts it relies on:
- The Price List Query API answers in us-east-1, eu-central-1 and ap-south-1 only, and each endpoint
  holds the prices of every region (botocore's endpoints.json, `api.pricing`: those three; the
  service model `pricing/2017-10-15`: GetProducts takes a ServiceCode and Filters of type
  TERM_MATCH, EQUALS, CONTAINS, ANY_OF or NONE_OF, and answers PriceList items as JSON documents).
- GetProducts, like the service's other actions, has no resource types in the Service
  Authorization Reference (cfn-lint's bundled AdditionalSpecs/Policies.json, `pricing`: no
  resources): it is granted on "*".
- The attribute names and values that pick the one on-demand product of a type (regionCode,
  instanceType, operatingSystem Linux, tenancy Shared, preInstalledSw NA, capacitystatus Used,
  licenseModel "No License required") and the document's shape (terms.OnDemand.*.priceDimensions.*
  .pricePerUnit.USD, unit Hrs) are from memory of the Price List documents (ledger: price-list-ec2-query).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any

from .awsapi import AWS_ERRORS, log_event

EC2_SERVICE_CODE = "AmazonEC2"
# The product of a type's on-demand Linux price (ledger: price-list-ec2-query).
EC2_ON_DEMAND_LINUX = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                       "capacitystatus": "Used", "licenseModel": "No License required"}
CACHE_PREFIX = "price#"
CACHE_DAYS = 30
"""A cached price is read again after this many days (list prices change a few times a year)."""


class PriceListError(ValueError):
    """The Price List answered something that is not a price."""


def _term_filters(attributes: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in attributes.items()]


def documents(pricing: Any, service: str, filters: list[dict[str, str]]) -> Iterator[dict[str, Any]]:
    """Every product document GetProducts answers for `filters`, page by page."""
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"ServiceCode": service, "Filters": filters, "FormatVersion": "aws_v1",
                                  "MaxResults": 100}
        if token:
            kwargs["NextToken"] = token
        answer = pricing.get_products(**kwargs)
        for item in answer.get("PriceList", []):
            try:
                doc = json.loads(item) if isinstance(item, str) else item
            except ValueError:
                raise PriceListError("a PriceList item is not a JSON document") from None
            if not isinstance(doc, dict):
                raise PriceListError("a PriceList item is not a JSON object")
            yield doc
        token = answer.get("NextToken")
        if not token:
            return


def on_demand_usd(doc: Mapping[str, Any], unit: str = "Hrs") -> list[float]:
    """The USD prices per `unit` of a product's on-demand terms (first tier of each dimension)."""
    prices = []
    try:
        for term in (doc.get("terms", {}).get("OnDemand") or {}).values():
            for dim in term["priceDimensions"].values():
                if dim.get("unit") == unit and str(dim.get("beginRange", "0")) == "0":
                    prices.append(float(dim["pricePerUnit"]["USD"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PriceListError(f"an on-demand term is malformed: {exc!r}") from None
    return prices


def instance_usd_per_hour(pricing: Any, region: str, instance_type: str) -> float | None:
    """The on-demand Linux USD/h of `instance_type` in `region`; None when the Price List has none.

    Several matching products (it should be one) answer the highest: the guard then errs towards
    stopping early. AWS errors propagate; an answer that is not a price is a PriceListError.
    """
    filters = _term_filters({"regionCode": region, "instanceType": instance_type, **EC2_ON_DEMAND_LINUX})
    found = [p for doc in documents(pricing, EC2_SERVICE_CODE, filters) for p in on_demand_usd(doc) if p > 0]
    return max(found) if found else None


class PriceCache:
    """Prices fetched from the Price List, kept in the guard-state table beside the groups' records.

    Items: key (stack, `price#<region>#<type>`), `usd_per_hour` and `fetched_at`; the stack's partition,
    which its handlers' role may already read and write (dynamodb:LeadingKeys), and no node group is
    named so (`GuardState` merges only the items of groups it described).
    """

    def __init__(self, dynamodb: Any, table: str, stack: str) -> None:
        self.dynamodb, self.table, self.stack = dynamodb, table, stack

    def _key(self, region: str, instance_type: str) -> dict[str, Any]:
        return {"stack": {"S": self.stack}, "group": {"S": f"{CACHE_PREFIX}{region}#{instance_type}"}}

    def get(self, region: str, instance_type: str, now: datetime) -> float | None:
        item = self.dynamodb.get_item(TableName=self.table, Key=self._key(region, instance_type)).get("Item")
        if not isinstance(item, dict):
            return None
        try:
            fetched = datetime.fromisoformat(item["fetched_at"]["S"])
            price = float(item["usd_per_hour"]["N"])
        except (KeyError, TypeError, ValueError):
            return None  # unreadable: fetched again and overwritten
        return price if now - fetched < timedelta(days=CACHE_DAYS) and price > 0 else None

    def put(self, region: str, instance_type: str, usd_per_hour: float, now: datetime) -> None:
        self.dynamodb.put_item(TableName=self.table, Item={
            **self._key(region, instance_type), "usd_per_hour": {"N": repr(usd_per_hour)},
            "fetched_at": {"S": now.isoformat()}})


def cached_lookup(pricing: Any, cache: PriceCache | None, region: str,
                  now: datetime) -> Callable[[str], float | None]:
    """A type -> USD/h lookup: the table's cached price, else the Price List's (then cached).

    A cache that cannot be read or written is logged and passed by (the Price List still answers);
    a Price List failure propagates: the guard's invocation fails and its retry asks again.
    """
    def lookup(instance_type: str) -> float | None:
        if cache is not None:
            try:
                cached = cache.get(region, instance_type, now)
            except AWS_ERRORS as exc:
                log_event("price cache unreadable", logging.WARNING, error=str(exc))
                cached = None
            if cached is not None:
                return cached
        price = instance_usd_per_hour(pricing, region, instance_type)
        if price is not None and cache is not None:
            try:
                cache.put(region, instance_type, price, now)
            except AWS_ERRORS as exc:
                log_event("price cache not written", logging.WARNING, error=str(exc))
        log_event("priced from the AWS Price List", instance_type=instance_type, region=region,
                  usd_per_hour=price)
        return price
    return lookup


class FallbackPrices(Mapping[str, float]):
    """The rendered on-demand table, asking `lookup` once for a type it lacks (what `accrual` reads)."""

    def __init__(self, rendered: Mapping[str, float], lookup: Callable[[str], float | None]) -> None:
        self._known: dict[str, float] = dict(rendered)
        self._missing: set[str] = set()
        self._lookup = lookup

    def __getitem__(self, instance_type: str) -> float:
        if instance_type in self._known:
            return self._known[instance_type]
        if instance_type in self._missing:
            raise KeyError(instance_type)
        price = self._lookup(instance_type)
        if price is None:
            self._missing.add(instance_type)
            raise KeyError(instance_type)
        self._known[instance_type] = price
        return price

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self._known))

    def __len__(self) -> int:
        return len(self._known)
