"""Which operating system an AMI boots, and whether gpucluster's node scripts run on it.

EC2 does not say which distribution an image holds: DescribeImages gives its name, description,
PlatformDetails ("Linux/UNIX" for Ubuntu and Amazon Linux alike, "Windows", "Red Hat Enterprise
Linux", ...: EC2 API reference, Image) and the root device name. The names and descriptions AWS and
Canonical give their images say it (Canonical: `ubuntu/images/.../ubuntu-jammy-22.04-amd64-server-*`;
Amazon Linux 2023: `al2023-ami-*`; the Deep Learning AMIs: `... (Ubuntu 22.04) ...`,
`... (Amazon Linux 2023) ...`; EKS: `amazon-eks-node-al2023-*`; from those images' naming as
published, not checked against every image, ledger: ami-os-names), so `os_of` reads them; an image whose
name says neither is "unknown", and the node's own check (node/os.sh, /etc/os-release) decides at boot.

SUPPORTED is the same list as node/os.sh's: a test keeps the two in step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

SUPPORTED: dict[str, tuple[str, str]] = {
    "Ubuntu 22.04": ("ubuntu", "ubuntu"),
    "Ubuntu 24.04": ("ubuntu", "ubuntu"),
    "Amazon Linux 2023": ("al2023", "ec2-user"),
}
"""Each operating system the node scripts run on: (gpucluster-os's family, the job user)."""

# (operating system, pattern over "name description", lower case), first match wins: 2023 before 2.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("Ubuntu 22.04", re.compile(r"ubuntu.*(22\.04|jammy)|(22\.04|jammy).*ubuntu")),
    ("Ubuntu 24.04", re.compile(r"ubuntu.*(24\.04|noble)|(24\.04|noble).*ubuntu")),
    ("Ubuntu 20.04", re.compile(r"ubuntu.*(20\.04|focal)|(20\.04|focal).*ubuntu")),
    ("Amazon Linux 2023", re.compile(r"al2023|amazon[-_ ]linux[-_ ]2023")),
    ("Amazon Linux 2", re.compile(r"amzn2|amazon[-_ ]linux[-_ ]2\b|\bal2\b")),
)


@dataclass(frozen=True)
class AmiFacts:
    """What DescribeImages says of one image, and the operating system read from it."""

    image_id: str
    name: str
    platform_details: str
    root_device_name: str
    os: str | None
    """An operating system named in the image's name or description (None: neither says one)."""

    @property
    def supported(self) -> bool:
        return self.os in SUPPORTED

    @property
    def job_user(self) -> str | None:
        return SUPPORTED[self.os][1] if self.os in SUPPORTED else None


def os_of(name: str, description: str = "", platform_details: str = "") -> str | None:
    """The operating system an image's name or description names, or its platform when that is not
    Linux/UNIX (Windows, Red Hat, SUSE...); None when nothing says."""
    if platform_details and not platform_details.startswith("Linux/UNIX"):
        return platform_details
    text = f"{name} {description}".lower()
    return next((system for system, pattern in _PATTERNS if pattern.search(text)), None)


def ami_facts(image: dict[str, Any]) -> AmiFacts:
    """One DescribeImages `Images` entry as AmiFacts."""
    name, description = str(image.get("Name") or ""), str(image.get("Description") or "")
    platform = str(image.get("PlatformDetails") or "")
    return AmiFacts(str(image["ImageId"]), name, platform, str(image.get("RootDeviceName") or ""),
                    os_of(name, description, platform))


def describe_amis(ec2: Any, image_ids: list[str]) -> dict[str, AmiFacts]:
    """The facts of each image EC2 knows, by id (an id it does not know is left out). ClientError
    passes through, but for an unknown or malformed id, which leaves that id out."""
    found: dict[str, AmiFacts] = {}
    for image_id in image_ids:  # one call each: one bad id fails the whole call (InvalidAMIID.*)
        try:
            images = ec2.describe_images(ImageIds=[image_id])["Images"]
        except ClientError as err:
            if not str(err.response.get("Error", {}).get("Code", "")).startswith("InvalidAMIID"):
                raise
            continue
        found.update((i["ImageId"], ami_facts(i)) for i in images)
    return found
