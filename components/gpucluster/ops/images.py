"""`gpucluster image build`: run a stack's Image Builder pipelines now, and read what they built.

It finds each baked group's pipeline by the name the stack gave it (`node.bake.recipe_name`: the
cluster, the group and a hash of the stack's identity, so never another stack's), starts it
(StartImagePipelineExecution with a client token, so a retried request is one build), and with
`wait` follows each build to its end (GetImage), then reads what the image test recorded in the
AMI's tags (GPU count, driver, CUDA: EC2 DescribeImages). It never changes a node group: the result
says which `images.groups.<group>` lines move a group onto the new image, for the user to write.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpucluster.node.bake import recipe_name
from gpucluster.ops import OpsError
from gpucluster.spec import StackSpec, baked_image

# EC2 Image Builder API reference, ImageState.status: PENDING, CREATING, BUILDING, TESTING,
# DISTRIBUTING, INTEGRATING, AVAILABLE, CANCELLED, FAILED, DEPRECATED, DELETED, DISABLED.
DONE = frozenset({"AVAILABLE", "CANCELLED", "FAILED", "DEPRECATED", "DELETED", "DISABLED"})
POLL_SECONDS = 60.0
WAIT_HOURS = 4.0


class ImageBuildError(OpsError):
    """A build the stack cannot start (nothing baked, no such group, not deployed): one line."""


@dataclass(frozen=True)
class ImageBuild:
    """One group's build: started, then (with wait) what it produced."""

    node_group: str
    pipeline_arn: str
    build_arn: str
    status: str = "PENDING"
    reason: str | None = None
    ami_id: str | None = None
    gpus: str | None = None
    driver: str | None = None
    cuda: str | None = None

    def pin(self) -> dict[str, str] | None:
        """The `images.groups.<group>` entry that moves the group onto this image (None: no image)."""
        if self.ami_id is None:
            return None
        entry = {"ami_id": self.ami_id}
        entry |= {k: v for k, v in (("driver", self.driver), ("cuda", self.cuda)) if v}
        return entry

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "pin": self.pin()}


def baked_groups(spec: StackSpec, node_group: str | None = None) -> list[str]:
    names = [g.name for g in spec.node_groups if baked_image(spec.images, g) is not None]
    if not names:
        raise ImageBuildError("no node group is baked (set images.bake: true in the stack file)")
    if node_group is not None:
        if node_group not in names:
            raise ImageBuildError(f"node group {node_group!r} is not baked (baked: {', '.join(names)})")
        return [node_group]
    return names


def find_pipeline(imagebuilder: Any, name: str) -> str | None:
    """The ARN of this account's pipeline named `name` (ListImagePipelines, paginated)."""
    for page in imagebuilder.get_paginator("list_image_pipelines").paginate(
            filters=[{"name": "name", "values": [name]}]):
        for pipeline in page.get("imagePipelineList", []):
            if pipeline.get("name") == name:
                return str(pipeline["arn"])
    return None


def start_builds(spec: StackSpec, imagebuilder: Any, node_group: str | None = None,
                 token: str | None = None) -> list[ImageBuild]:
    """Start the pipeline of each baked group (of one group when given); all found before any starts."""
    groups = baked_groups(spec, node_group)
    arns = {}
    for group in groups:
        arn = find_pipeline(imagebuilder, recipe_name(spec.cluster.name, spec.identity, group))
        if arn is None:
            raise ImageBuildError(f"no image pipeline for node group {group!r} in {spec.region}: deploy "
                                  "the stack first (pulumi up)")
        arns[group] = arn
    token = token or uuid.uuid4().hex
    builds = []
    for group in groups:
        # The same client token on a retried request starts no second build (API reference,
        # StartImagePipelineExecution: clientToken, idempotency).
        started = imagebuilder.start_image_pipeline_execution(
            imagePipelineArn=arns[group], clientToken=f"{token[:32]}-{group}"[:64])
        builds.append(ImageBuild(group, arns[group], started["imageBuildVersionArn"]))
    return builds


def image_tags(ec2: Any, ami_id: str) -> dict[str, str]:
    images = ec2.describe_images(ImageIds=[ami_id])["Images"]
    return {t["Key"]: t["Value"] for t in (images[0].get("Tags", []) if images else [])}


def follow(build: ImageBuild, imagebuilder: Any, ec2: Any, region: str) -> ImageBuild:
    """The build as Image Builder sees it now; once AVAILABLE, its AMI and the test's tags."""
    image = imagebuilder.get_image(imageBuildVersionArn=build.build_arn)["image"]
    state = image.get("state", {})
    status, reason = state.get("status", "PENDING"), state.get("reason")
    if status != "AVAILABLE":
        return ImageBuild(**{**asdict(build), "status": status, "reason": reason})
    amis = [a for a in image.get("outputResources", {}).get("amis", []) if a.get("region") == region]
    if not amis:
        return ImageBuild(**{**asdict(build), "status": "FAILED", "reason": f"no AMI in {region}"})
    ami = amis[0]["image"]
    tags = image_tags(ec2, ami)
    return ImageBuild(**{**asdict(build), "status": status, "reason": reason, "ami_id": ami,
                         "gpus": tags.get("gpucluster:gpus"), "driver": tags.get("gpucluster:driver"),
                         "cuda": tags.get("gpucluster:cuda")})


def wait_builds(builds: list[ImageBuild], imagebuilder: Any, ec2: Any, region: str, *,
                poll_seconds: float = POLL_SECONDS, wait_hours: float = WAIT_HOURS,
                sleep: Callable[[float], None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> list[ImageBuild]:
    """Follow every build until it ends or `wait_hours` pass (then it is reported as it stands)."""
    deadline = clock() + wait_hours * 3600
    current = [follow(b, imagebuilder, ec2, region) for b in builds]
    while any(b.status not in DONE for b in current) and clock() < deadline:
        sleep(poll_seconds)
        current = [b if b.status in DONE else follow(b, imagebuilder, ec2, region) for b in current]
    return current
