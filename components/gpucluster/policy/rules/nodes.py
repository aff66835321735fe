"""GPU node hardening rules: IMDSv2 only, no public IPs, encrypted volumes.

Owns `imdsv2-required`, `no-public-ip-on-gpu-nodes` and `encrypted-volumes`:
each looks at one launch template, instance or EBS volume. Pure: reads
resource records only, never Pulumi or AWS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpucluster.policy.records import UNKNOWN, Resource, dig, items, true_or_unknown, truthy
from gpucluster.policy.rules.registry import rule
from gpucluster.policy.rules.tokens import EBS_VOLUME, INSTANCE, LAUNCH_TEMPLATE


@rule("imdsv2-required",
      "Instances and launch templates require IMDSv2 (metadataOptions.httpTokens = required).",
      "resource")
def imdsv2_required(resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
    # EC2 user guide, "Configure the instance metadata options": httpTokens required = IMDSv2 only.
    if resource.type not in (LAUNCH_TEMPLATE, INSTANCE):
        return
    tokens = dig(resource.props, "metadataOptions", "httpTokens")
    if tokens is UNKNOWN or tokens == "required":
        return
    yield (f"metadataOptions.httpTokens is {tokens!r}, not 'required': IMDSv1 lets any SSRF read "
           "the node's credentials" if tokens else
           "metadataOptions.httpTokens is not set, so IMDSv1 stays on; set it to 'required'")


@rule("no-public-ip-on-gpu-nodes",
      "GPU nodes (launch templates and instances) get no public IP: they live in private subnets "
      "and are reached through SSM.",
      "resource")
def no_public_ip(resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
    if resource.type == LAUNCH_TEMPLATE:
        nics = items(resource.props.get("networkInterfaces"))
        if nics is UNKNOWN:
            return
        for i, nic in enumerate(nics):
            if truthy(dig(nic, "associatePublicIpAddress")):
                yield f"networkInterfaces[{i}].associatePublicIpAddress is true"
    elif resource.type == INSTANCE and truthy(resource.props.get("associatePublicIpAddress")):
        yield "associatePublicIpAddress is true"


@rule("encrypted-volumes",
      "EBS volumes are encrypted: launch-template block devices, instance volumes and EBS volumes.",
      "resource")
def encrypted_volumes(resource: Resource, config: Mapping[str, Any]) -> Iterable[str]:
    props = resource.props
    if resource.type == LAUNCH_TEMPLATE:
        mappings = items(props.get("blockDeviceMappings"))
        if mappings is UNKNOWN:
            return
        if not mappings:
            yield ("no blockDeviceMappings: the root volume is the AMI's, unencrypted unless the "
                   "account turns on EBS encryption by default; map it with ebs.encrypted = true")
        for i, mapping in enumerate(mappings):
            ebs = dig(mapping, "ebs")
            if isinstance(ebs, Mapping) and not true_or_unknown(ebs.get("encrypted")):
                yield (f"blockDeviceMappings[{i}] ({dig(mapping, 'deviceName') or '?'}) has "
                       "ebs.encrypted unset or false")
    elif resource.type == INSTANCE:
        root = props.get("rootBlockDevice")
        encrypted = dig(root, "encrypted")
        if root is not UNKNOWN and not (isinstance(root, Mapping) and true_or_unknown(encrypted)):
            yield "rootBlockDevice.encrypted is unset or false"
        disks = items(props.get("ebsBlockDevices"))
        for i, disk in enumerate(disks if disks is not UNKNOWN else []):
            if not true_or_unknown(dig(disk, "encrypted")):
                yield f"ebsBlockDevices[{i}].encrypted is unset or false"
    elif resource.type == EBS_VOLUME and not true_or_unknown(props.get("encrypted")):
        yield "encrypted is unset or false"
