"""Regenerate `data/offerings.yaml`: in which zones of which regions each catalog type is offered.

    python -m gpucluster.catalog.refresh_offerings            # from the installed moto package
    python -m gpucluster.catalog.refresh_offerings --check    # exit 1 when the shipped file differs
    python -m gpucluster.catalog.refresh_offerings --from-aws --regions us-east-1,us-west-2

moto ships AWS's DescribeInstanceTypeOfferings answers (LocationType=availability-zone) as
`moto/ec2/resources/instance_type_offerings/availability-zone/<region>.json.gz`, one file a
region, which moto's maintainers regenerate from AWS. `--from-aws` asks your own account
instead (credentials needed): zone *names* are mapped to physical zones per account in the
older regions, so your account's answer is the one that binds your stacks. Only the catalog's
instance types are kept. The output is deterministic (sorted), so `--check` can gate CI.
It never writes anything but the one data file.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpucluster import catalog

HEADER = """\
# Where each catalog instance type is offered: region -> instance type -> availability zones.
#
# Source: {source}, as of {as_of}.
# Regenerate with `python -m gpucluster.catalog.refresh_offerings` (from the installed moto;
# `--from-aws` asks your account). Zone names map to physical zones per account in older
# regions: this file is a planning default (the spec rejects a group whose first type is not
# offered in its zone); `gpucluster doctor` asks the account itself.
"""


def moto_offerings_dir() -> Path:
    """moto's per-region offering files (availability-zone location type)."""
    import moto  # a dev dependency: only this script and the tests need it

    return Path(moto.__file__).parent / "ec2" / "resources" / "instance_type_offerings" / "availability-zone"


def moto_version() -> str:
    from importlib.metadata import version

    return version("moto")


def from_moto(types: Iterable[str], directory: Path | None = None) -> dict[str, dict[str, list[str]]]:
    """region -> type -> sorted zones, for `types`, from moto's gzipped JSON files."""
    wanted = set(types)
    directory = directory or moto_offerings_dir()
    regions: dict[str, dict[str, list[str]]] = {}
    for path in sorted(directory.glob("*.json.gz")):
        region = path.name.removesuffix(".json.gz")
        with gzip.open(path, "rt") as handle:
            rows = json.load(handle)
        regions[region] = _group(rows, wanted)
    return regions


def from_aws(types: Iterable[str], regions: Iterable[str],
             session: Any = None) -> dict[str, dict[str, list[str]]]:
    """region -> type -> sorted zones, from DescribeInstanceTypeOfferings in each region."""
    import boto3

    session = session or boto3.Session()
    wanted = sorted(set(types))
    out: dict[str, dict[str, list[str]]] = {}
    for region in regions:
        ec2 = session.client("ec2", region_name=region)
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": wanted}])
        out[region] = _group((o for page in pages for o in page["InstanceTypeOfferings"]), set(wanted))
    return out


def _group(rows: Iterable[Mapping[str, str]], wanted: set[str]) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {}
    for row in rows:
        if row["InstanceType"] in wanted:
            found.setdefault(row["InstanceType"], set()).add(row["Location"])
    order = {name: i for i, name in enumerate(catalog.names())}
    return {t: sorted(found[t]) for t in sorted(found, key=lambda t: (order.get(t, len(order)), t))}


def render(regions: Mapping[str, Mapping[str, list[str]]], source: str, as_of: str) -> str:
    """The YAML text of data/offerings.yaml (flow lists, one type a line)."""
    lines = [HEADER.format(source=source, as_of=as_of).rstrip("\n"),
             f"source: {json.dumps(source)}", f'as_of: "{as_of}"', "regions:"]
    for region in sorted(regions):
        types = regions[region]
        if not types:
            lines.append(f"  {region}: {{}}")
            continue
        lines.append(f"  {region}:")
        lines += [f"    {t}: [{', '.join(zones)}]" for t, zones in types.items()]
    return "\n".join(lines) + "\n"


def moto_text() -> str:
    """What the shipped file holds when generated from the installed moto."""
    from gpucluster.catalog import MOTO_OFFERINGS_AS_OF

    source = (f"moto {moto_version()} ec2/resources/instance_type_offerings/availability-zone "
              "(AWS DescribeInstanceTypeOfferings, LocationType=availability-zone)")
    return render(from_moto(catalog.names()), source, MOTO_OFFERINGS_AS_OF)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpucluster.catalog.refresh_offerings",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-aws", action="store_true", help="ask your AWS account, not moto")
    parser.add_argument("--regions", default="", help="comma-separated regions for --from-aws "
                        "(default: the regions the shipped file holds)")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when it differs")
    parser.add_argument("--output", type=Path, default=catalog.OFFERINGS_FILE)
    args = parser.parse_args(argv)
    if args.from_aws:
        regions = [r for r in args.regions.split(",") if r] or sorted(catalog.offering_regions())
        source = "EC2 DescribeInstanceTypeOfferings (LocationType=availability-zone) of one AWS account"
        text = render(from_aws(catalog.names(), regions), source, datetime.now(UTC).strftime("%Y-%m-%d"))
    else:
        text = moto_text()
    current = args.output.read_text() if args.output.exists() else ""
    if args.check:
        if current != text:
            print(f"{args.output} is stale: run python -m gpucluster.catalog.refresh_offerings",
                  file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
