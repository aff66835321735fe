"""Named checks of the `images` section (EC2 Image Builder baking) and of a node group's `warm_pool`.

What is refused here is what AWS or the recipe would refuse later, at deploy or at the first build:
a recipe on a base whose packages the components cannot install, a pin on a group that is not baked,
a warm pool on a group Auto Scaling cannot keep one for. Small functions returning findings; never
imports Pulumi or AWS.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence

from gpucluster.spec.checks import check, group_check
from gpucluster.spec.findings import Finding
from gpucluster.spec.models import NodeGroupConfig, StackSpec, baked_image

# The recipe's components install with the base's own package manager (gpucluster-os: apt on Ubuntu,
# dnf on Amazon Linux 2023: the Lustre client for the AMI's kernel, DCGM) and systemd: the Deep
# Learning AMIs on Ubuntu or Amazon Linux 2023, x86_64 (AWS Deep Learning AMI developer guide, "Query
# AMI-ID with SSM Parameter": /aws/service/deeplearning/ami/x86_64/<name>-ubuntu-<version>/... and
# <name>-amazon-linux-2023/...; those names: ledger: ami-os-names).
SUPPORTED_PARAMETER_PREFIX = "/aws/service/deeplearning/ami/x86_64/"
SUPPORTED_PARAMETER_OS = re.compile(r"ubuntu|amazon-linux-2023")


def base_problem(group: NodeGroupConfig) -> str | None:
    """Why the group's base cannot carry the recipe, or None (the default DLAMI, an Ubuntu or Amazon
    Linux 2023 DLAMI parameter, or the group's own ami_id, which the user vouches is one of those with
    the NVIDIA driver; `gpucluster doctor` reads which OS it boots)."""
    param = group.ami_ssm_parameter
    if group.ami_id or param is None:
        return None
    if not param.startswith(SUPPORTED_PARAMETER_PREFIX) or not SUPPORTED_PARAMETER_OS.search(param):
        return (f"the base {param!r} is not an x86_64 Ubuntu or Amazon Linux 2023 Deep Learning AMI "
                f"parameter ({SUPPORTED_PARAMETER_PREFIX}...ubuntu... or ...amazon-linux-2023...): the "
                "recipe installs with apt or dnf; set images.groups.<group>.bake: false or use one of those")
    return None


@check
def images_rules(spec: StackSpec) -> Iterable[Finding]:
    images = spec.images
    names = [g.name for g in spec.node_groups]
    for name, own in images.groups.items():
        path = f"images.groups.{name}"
        if name not in names:
            hint = difflib.get_close_matches(name, names, n=1)
            yield Finding(path, f"no node group named {name!r}"
                          + (f" (did you mean {hint[0]!r}?)" if hint else ""))
            continue
        baked = own.bake if own.bake is not None else images.bake
        if not baked and (own.ami_id or own.driver or own.cuda):
            yield Finding(path, "pins a baked image but the group is not baked (set bake: true)")
        if own.ami_id is None and (own.driver or own.cuda):
            yield Finding(f"{path}.ami_id", "driver/cuda describe a pinned image: set ami_id too")
    baked_any = any(baked_image(images, g) is not None for g in spec.node_groups)
    if baked_any and spec.network.existing_vpc_id is None and not spec.network.nat_gateway:
        yield Finding("images.bake", "the image build runs in the stack's private subnet and downloads "
                      "packages and container images: it needs network.nat_gateway: true")
    for i, g in enumerate(spec.node_groups):
        if baked_image(images, g) is None:
            continue
        if (problem := base_problem(g)) is not None:
            yield Finding(f"node_groups[{i}].ami_ssm_parameter", problem)
        if not g.health_checks.enabled:
            yield Finding(f"node_groups[{i}].health_checks.enabled", "a baked group needs health checks: "
                          "the launch hook is what holds a node until its image is checked and its data "
                          "mounted (or set images.groups.<group>.bake: false)")


# Auto Scaling user guide, "Warm pools for Amazon EC2 Auto Scaling", Limitations: no warm pool for
# a group with a mixed instances policy or that launches Spot Instances, and instances are stopped
# only with an EBS root volume (gpucluster's roots are always EBS).
# Not re-read from this machine: ledger: warm-pool-limits. Capacity Blocks are reserved for
# a fixed window and launched by a plain launch template into the block: a stopped, prepared
# instance outside the block's window is what the block forbids, so they are refused too.
@group_check
def group_warm_pool(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    pool = g.warm_pool
    if pool is None:
        return
    at = f"{path}.warm_pool"
    if g.capacity.market == "capacity_block":
        yield Finding(at, "a warm pool cannot hold Capacity Block instances (the block is launched as "
                      "reserved, for its window only); remove warm_pool")
    elif g.capacity.spot_percent > 0:
        yield Finding(at, "Auto Scaling keeps no warm pool for a group that launches Spot Instances "
                      "(set capacity.spot_percent: 0 or remove warm_pool)")
    if not g.health_checks.enabled:
        yield Finding(at, "needs health_checks.enabled: the launch hook holds a warming node until its "
                      "installs and image are ready, or it is stopped half-way")
    if len(g.instance_types) > 1:
        yield Finding(at, "a warm pool needs one instance type: several need a mixed instances policy, "
                      "which Auto Scaling refuses with a warm pool")
    if pool.max_prepared is not None and pool.max_prepared < pool.min_size:
        yield Finding(f"{at}.max_prepared", f"must be >= min_size ({pool.min_size}), got {pool.max_prepared}")
    if pool.min_size > g.max_nodes:
        yield Finding(f"{at}.min_size", f"must be <= max_nodes ({g.max_nodes}), got {pool.min_size}")
