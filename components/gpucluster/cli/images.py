"""`gpucluster image build STACK`: bake the stack's node-group images now (EC2 Image Builder).

It owns the command-line side of gpucluster.ops.images: which groups, the confirmation that shows
what the builds cost before anything starts (`--yes` for scripts), and, with `--wait`, the images
built and the stack-file lines that move each group onto its new image (nothing moves by itself).
Exit codes as everywhere: 0 fine (a failed build with --wait: 1), 1 declined, 2 invalid input or
an AWS error, one line each.
"""

from __future__ import annotations

from typing import Annotated

import typer
import yaml

from gpucluster import catalog, pricing
from gpucluster.cli import common, render
from gpucluster.cli.common import (
    EXIT_BLOCKED,
    GroupOption,
    JsonOption,
    StackArg,
    YesOption,
    aws_call,
    build_spec,
    confirm_or_exit,
    fail_usage,
    head,
    usd,
)
from gpucluster.ops.images import ImageBuild, ImageBuildError, baked_groups, start_builds, wait_builds

image_app = typer.Typer(no_args_is_help=True, help="Bake the node groups' images (EC2 Image Builder).")


def render_builds(builds: list[ImageBuild]) -> list[str]:
    return render.table(["node group", "status", "AMI", "GPUs", "driver", "CUDA", "build"],
                        [[b.node_group, b.status + (f" ({b.reason})" if b.reason else ""), b.ami_id or "-",
                          b.gpus or "-", b.driver or "-", b.cuda or "-", b.build_arn] for b in builds])


def pin_lines(builds: list[ImageBuild]) -> list[str]:
    """The stack-file lines that move each group onto its new image."""
    pins = {b.node_group: pin for b in builds if (pin := b.pin())}
    if not pins:
        return []
    text = yaml.safe_dump({"gpucluster:images": {"groups": pins}}, sort_keys=False)
    return ["move the groups onto the new images: in the stack file, set", *text.splitlines(),
            "then `pulumi up` (new nodes launch from them; running nodes are not replaced)"]


@image_app.command("build")
def build(
    stack: StackArg,
    group: GroupOption = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the builds to their end and print "
                                                      "the images and their driver/CUDA.")] = False,
    yes: YesOption = False,
    as_json: JsonOption = False,
) -> None:
    """Run the stack's image pipelines now (each baked group, or one); asks first (instances cost)."""
    render.use_json(as_json)
    spec = build_spec(stack)
    try:
        groups = baked_groups(spec, group)
    except ImageBuildError as err:
        fail_usage("image build", str(err))
    build_type = catalog.get(spec.images.build_instance_type)
    rate = pricing.on_demand_rate(build_type, spec.region).usd_per_hour if build_type else 0.0
    cost = len(groups) * pricing.IMAGE_BUILD_HOURS * rate
    confirm_or_exit("image build", f"build {len(groups)} image(s) ({', '.join(groups)}) on "
                    f"{spec.images.build_instance_type}: about ${usd(cost)} of instance time. Start?", yes)
    imagebuilder = common.client(spec, "imagebuilder")
    try:
        builds = aws_call("image build", lambda: start_builds(spec, imagebuilder, group), "starting builds")
        if wait:
            builds = aws_call("image build", lambda: wait_builds(
                builds, imagebuilder, common.client(spec, "ec2"), spec.region), "building (an hour or so)")
    except ImageBuildError as err:
        fail_usage("image build", str(err))
    failed = [b for b in builds if wait and b.status != "AVAILABLE"]
    if as_json:
        render.emit(head(spec, builds=[b.as_json() for b in builds]))
    else:
        render.say(f"stack {spec.stack} ({spec.region}): {len(builds)} image build(s)"
                   + ("" if wait else " started; follow them with --wait or in the Image Builder console"))
        for line in [*render_builds(builds), *pin_lines(builds)]:
            render.say(line)
    if failed:
        raise typer.Exit(EXIT_BLOCKED)
