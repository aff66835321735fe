"""`gpucluster capacity`: find and buy EC2 Capacity Blocks for ML, and the node group that uses one.

It owns the command-line side of gpucluster.ops.capacity: options, the offerings table, the
confirmation that shows the total price before anything is bought (`--yes` for scripts), and
the node-group snippet printed after a purchase. Exit codes as everywhere: 0 fine, 1 declined
(nothing bought), 2 invalid input or an AWS error, one line each.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from gpucluster.cli import render
from gpucluster.cli.common import (
    JsonOption,
    aws_call,
    confirm_or_exit,
    fail_usage,
    usd,
)
from gpucluster.ops.capacity import (
    MAX_INSTANCES,
    WARNING_BEFORE_END,
    CapacityError,
    Offering,
    OfferingCache,
    node_group_snippet,
    purchase,
    search_offerings,
)

capacity_app = typer.Typer(no_args_is_help=True, help="Find and buy EC2 Capacity Blocks for ML.")


def ec2_client(region: str | None) -> Any:
    """An EC2 client in `region` (default: the AWS configuration's); honours AWS_ENDPOINT_URL."""
    from botocore.exceptions import NoRegionError

    from gpucluster.ops import make_client

    try:
        return make_client("ec2", region or None)
    except NoRegionError:
        fail_usage("capacity", "no region: pass --region or set AWS_REGION")


def _region_of(client: Any) -> str:
    return str(client.meta.region_name)


def _when(option: str, text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        fail_usage("capacity search",
                   f"{option}: must be a date like 2026-12-01 or 2026-12-01T11:30, got {text!r}")
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _span(o: Offering) -> str:
    return f"{o.start:%Y-%m-%d %H:%M} -> {o.end:%Y-%m-%d %H:%M} UTC"


@capacity_app.command()
def search(
    instance_type: Annotated[str, typer.Option("--type", help="Instance type, e.g. p5.48xlarge.")],
    count: Annotated[int, typer.Option(help=f"Instances in the block (1-{MAX_INSTANCES}).")],
    days: Annotated[int, typer.Option(help="How long: 1-14 days, or whole weeks up to 182 days.")],
    start: Annotated[str | None, typer.Option(help="Earliest start (UTC), e.g. 2026-12-01.")] = None,
    end: Annotated[str | None, typer.Option(help="Latest end (UTC).")] = None,
    region: Annotated[str | None, typer.Option(help="Region (default: your AWS configuration's).")] = None,
    as_json: JsonOption = False,
) -> None:
    """List Capacity Block offerings with their total and hourly price (read-only)."""
    render.use_json(as_json)
    client = ec2_client(region)
    try:
        found = aws_call("capacity search", lambda: search_offerings(
            client, instance_type, count, days, _when("--start", start), _when("--end", end)),
            f"asking EC2 for Capacity Block offerings of {count} x {instance_type}")
    except CapacityError as err:
        fail_usage("capacity search", str(err))
    where = _region_of(client)
    OfferingCache().remember(found, where)
    if as_json:
        render.emit({"region": where, "offerings": [o.as_json() for o in found]})
        return
    if not found:
        render.say(f"no Capacity Block offering for {count} x {instance_type} for {days} day(s) in {where}; "
                   "try other dates (--start), another count or another region")
        return
    render.say(f"Capacity Block offerings for {count} x {instance_type}, {days} day(s), in {where} "
               "(paid up front, not refundable):")
    rows = [[o.offering_id, o.availability_zone, _span(o), str(o.duration_hours), usd(o.upfront_usd),
             usd(o.usd_per_hour), usd(o.usd_per_instance_hour)] for o in found]
    for line in render.table(["offering", "zone", "window", "hours", "total $", "$/h", "$/instance-h"], rows):
        render.say(line)
    render.say("")
    render.say(f"buy one (asks first, showing the total): gpucluster capacity buy {found[0].offering_id}")


@capacity_app.command()
def buy(
    offering_id: Annotated[str, typer.Argument(help="An offering id `capacity search` listed (cb-...).")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation (scripts).")] = False,
    name: Annotated[str | None, typer.Option(
        help="Name of the node group in the printed snippet (default block-<family>).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Buy a Capacity Block after a confirmation that shows its total price; print its node group.

    With --json it cannot ask: give --yes.
    """
    render.use_json(as_json)
    cache = OfferingCache()
    cached = cache.get(offering_id)
    if cached is None:
        fail_usage("capacity buy", f"offering {offering_id} is not among those `gpucluster capacity search` "
                   f"listed ({cache.path}); search first: AWS cannot describe an offering by id")
    o = cached.offering
    if as_json:
        confirm_or_exit("buy", "", yes)  # --json cannot ask: without --yes, exit 2 and nothing bought
        block = aws_call("capacity buy", lambda: purchase(ec2_client(cached.region), o),
                          f"buying Capacity Block {o.offering_id}")
        render.emit({"region": cached.region, "offering": o.as_json(), "reservation_id": block.reservation_id,
                     "state": block.state, "upfront_usd": o.upfront_usd, "currency": o.currency,
                     "node_group": node_group_snippet(block, name)})
        return
    render.say(f"Capacity Block {o.offering_id}: {o.instance_count} x {o.instance_type} in "
               f"{o.availability_zone} ({cached.region}), {_span(o)}, {o.duration_hours} hours")
    render.say(f"total price: ${usd(o.upfront_usd)} {o.currency}, paid up front and not refundable "
               f"(${usd(o.usd_per_hour)}/hour, ${usd(o.usd_per_instance_hour)} per instance-hour; "
               f"listed {cached.listed_at:%Y-%m-%d %H:%M} UTC)")
    confirm_or_exit("buy", f"Buy it for ${usd(o.upfront_usd)}?", yes, declined="nothing bought")
    client = ec2_client(cached.region)
    block = aws_call("capacity buy", lambda: purchase(client, o))
    render.say(f"bought Capacity Block {block.reservation_id} ({block.state}) for ${usd(o.upfront_usd)}")
    render.say("")
    render.say("node group that uses it (paste under `config:` in stacks/Pulumi.<env>.yaml):")
    render.say("")
    for line in render.yaml_lines(node_group_snippet(block, name)):
        typer.echo(line)
    render.say("")
    minutes = int(WARNING_BEFORE_END.total_seconds() // 60)
    render.say(f"then: gpucluster plan <env>; gpucluster doctor <env> (the reservation's state and window); "
               f"pulumi up. Nodes launch when the block starts; {minutes} minutes before it ends the "
               "guardrail runs autostop.pre_stop_command and scales the group to zero.")
