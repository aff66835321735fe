"""`gpucluster catalog prices`: a region's prices from the AWS Price List, into the project's price file.

It owns the command-line side of gpucluster.ops.pricelist: the region option, where the file goes
(beside the project's Pulumi.yaml, else the current directory) and the one-line summary of what
was priced and what was not. Exit codes as everywhere: 0 written, 2 invalid input or an AWS error.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from gpucluster import catalog, project
from gpucluster.cli import render
from gpucluster.cli.common import JsonOption, fail_usage, ops_call

catalog_app = typer.Typer(no_args_is_help=True, help="The instance catalog: prices for another region.")


@catalog_app.command("prices")
def prices(
    region: Annotated[str, typer.Option(
        help="The region to price (one the catalog carries no prices for, e.g. eu-west-1).")],
    as_json: JsonOption = False,
) -> None:
    """Fetch a region's on-demand GPU and service prices from the AWS Price List (AWS credentials) into
    the project's price file, which plan, cost and recommend read."""
    from gpucluster.ops.pricelist import fetch_region_prices, pricing_client, write_price_file  # boto3

    render.use_json(as_json)
    if region in catalog.carried():
        fail_usage("catalog prices", f"--region: the catalog carries {region}'s prices already")
    if region not in catalog.offering_regions():
        fail_usage("catalog prices", f"--region: {region!r} is not a region the catalog knows "
                   f"({', '.join(catalog.offering_regions())})")
    path = project.price_file_path()
    found = ops_call("catalog prices", lambda: fetch_region_prices(pricing_client(region), region,
                                                                    datetime.now(UTC)),
                     f"reading {region}'s prices from the AWS Price List")
    ops_call("catalog prices", lambda: write_price_file(path, found), None)
    if as_json:
        render.emit({"region": region, "file": str(path), **found.entry(),
                     "unpriced_types": found.unpriced_types, "missing_services": found.missing_services})
        return
    missing = f"; no Price List price for {', '.join(found.unpriced_types)}" if found.unpriced_types else ""
    render.echo(f"{path}: {len(found.on_demand_usd_per_hour)} GPU types priced in {region}{missing}")
    if found.missing_services:
        for line in render.wrap(f"not found in the Price List: {', '.join(found.missing_services)}; `cost` "
                                f"cannot price {region}'s other costs until they are in the file"):
            render.echo(line)
