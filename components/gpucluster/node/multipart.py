"""A node's user data as a MIME multi-part document: what AWS PCS and EKS's `nodeadm` need of our template.

AWS PCS launches a Slurm stack's nodes from our launch template and adds its own user data (the PCS
agent's registration) to ours, so ours must be a MIME multi-part document whose parts are of the types
the PCS guide documents, `text/x-shellscript` or `text/cloud-config`, with a blank line before the
closing boundary ("Using Amazon EC2 launch templates with AWS PCS",
https://docs.aws.amazon.com/pcs/latest/userguide/working-with_launch-templates.html;
ledger: pcs-launch-template-multipart). The node bootstrap
(one bash script) goes in as one `text/x-shellscript` part: no gzip part (cloud-init reads gzip, PCS
does not document it). So that a Slurm node's bootstrap fits EC2's 16 KiB as well as the Auto Scaling
path's gzipped one does, the part is a small shell script that carries the bootstrap gzipped and
base64-encoded, writes it out and runs it (`self_extracting`). The Auto Scaling path keeps its gzipped
script (`userdata.encode_user_data`), byte for byte. Pure: no Pulumi, no AWS call; the bytes are the
same for the same script (gzip mtime 0, a fixed boundary).

On an EKS stack (`scheduler: {type: eks}`) the EKS-optimised Amazon Linux 2023 AMI boots with `nodeadm`,
which joins the node to the cluster from a `NodeConfig` (apiVersion node.eks.aws/v1alpha1) it reads from a
MIME part of content type `application/node.eks.aws` (Amazon EKS user guide, "Upgrade from AL2 to AL2023";
the nodeadm API reference, https://awslabs.github.io/amazon-eks-ami/nodeadm/; ledger: eks-nodeadm-nodeconfig).
That part comes first, then our bootstrap's, which cloud-init runs. `node_config` renders it: the cluster's
name, API endpoint, CA and service CIDR, and the kubelet's labels (the node group, its purchase option) and
the `nvidia.com/gpu` taint, so only pods that ask for a GPU land on a GPU node.
"""

from __future__ import annotations

import base64
import gzip
import textwrap
from collections.abc import Mapping, Sequence

import yaml

# A line no script of ours holds (multipart_document refuses one that does).
BOUNDARY = "==GPUCLUSTER-BOUNDARY=="
# What AWS PCS adds to the document (its own part: the PCS agent's registration) is not documented as a
# size: 1,024 bytes are kept free of our part, for a few lines of cloud-config; a larger PCS part would
# make a launch fail on EC2's 16 KiB (ledger: pcs-user-data-reserve).
PCS_USER_DATA_BYTES = 1024


def _head(script: str, node_config: str | None = None) -> str:
    charset = "us-ascii" if script.isascii() else "utf-8"
    return ("MIME-Version: 1.0\n"
            f'Content-Type: multipart/mixed; boundary="{BOUNDARY}"\n\n'
            + (_node_config_part(node_config) if node_config is not None else "")
            + f"--{BOUNDARY}\n"
            f'Content-Type: text/x-shellscript; charset="{charset}"\n'
            + ("" if charset == "us-ascii" else "Content-Transfer-Encoding: 8bit\n")
            + 'Content-Disposition: attachment; filename="gpucluster-bootstrap.sh"\n\n')


_TAIL = f"\n--{BOUNDARY}--\n"  # after the script's last newline: the blank line the PCS guide asks for


PAYLOAD_END = "GPUCLUSTER_BOOTSTRAP_GZ"


def self_extracting(script: str) -> str:
    """A bash script that writes `script` (carried gzipped, base64 in a quoted here-document: nothing in
    it is expanded) to a file under /run and runs it, so its exit status and output are the script's."""
    payload = base64.b64encode(gzip.compress(script.encode(), compresslevel=9, mtime=0)).decode()
    return ("#!/bin/bash\n"
            "# gpucluster's node bootstrap, gzipped to fit EC2's user data: written out, then run.\n"
            "set -euo pipefail\n"
            "bootstrap=$(mktemp /run/gpucluster-bootstrap.XXXXXX)\n"
            f"base64 -d <<'{PAYLOAD_END}' | gunzip > \"$bootstrap\"\n"
            + "\n".join(textwrap.wrap(payload, 76)) + "\n"
            f"{PAYLOAD_END}\n"
            'exec bash "$bootstrap"\n')


def multipart_document(script: str, node_config: str | None = None) -> str:
    """`script`, self-extracting, as the `text/x-shellscript` part of a multipart/mixed document; on an
    EKS stack after the `nodeadm` NodeConfig part (`node_config`, YAML), which nodeadm reads first."""
    if f"--{BOUNDARY}" in script or (node_config is not None and f"--{BOUNDARY}" in node_config):
        raise ValueError(f"the node script holds the MIME boundary --{BOUNDARY}")
    part = self_extracting(script)
    return _head(part, node_config) + part + _TAIL


def multipart_size(script: str, node_config: str | None = None) -> int:
    """Bytes of the document for `script`: what EC2 counts against its 16 KiB (the raw user data, before
    the launch template's own base64)."""
    return len(multipart_document(script, node_config).encode())


def encode_multipart_user_data(script: str, limit: int, node_config: str | None = None) -> str:
    """The document, base64-encoded as a launch template's user data; ValueError past `limit` bytes."""
    document = multipart_document(script, node_config).encode()
    if len(document) > limit:
        raise ValueError(f"user data is {len(document)} bytes as a MIME multi-part document; "
                         f"EC2 allows {limit}")
    return base64.b64encode(document).decode()


# ------------------------------------------------------------------------------ EKS: nodeadm

NODE_CONFIG_CONTENT_TYPE = "application/node.eks.aws"
NODE_CONFIG_API_VERSION = "node.eks.aws/v1alpha1"
GROUP_LABEL = "gpucluster.io/group"
PURCHASE_LABEL = "gpucluster.io/purchase"
GPU_TAINT = ("nvidia.com/gpu", "true", "NoSchedule")
"""Key, value, effect: what a GPU pod tolerates (the NVIDIA device plugin's own convention)."""
# What an EKS node's NodeConfig part adds to the user data at most: the certificate authority (a PEM
# certificate base64-encoded: about 1.5 KB for EKS's 2048-bit CA), the endpoint, the labels and taint
# (measured on the rendered part with a 2,000-character CA: tests/test_eks.py).
EKS_NODE_CONFIG_BYTES = 3072


def purchase_label(market: str, spot_percent: float) -> str:
    """on-demand, spot or capacity-block: one per EKS node group (spec/scheduler.py: 0 or 100 % spot)."""
    if market == "capacity_block":
        return "capacity-block"
    return "spot" if spot_percent >= 100 else "on-demand"


def node_labels(group: str, purchase: str) -> dict[str, str]:
    """The labels every node of a group registers with (Kueue's flavours and the autoscaler select them)."""
    return {GROUP_LABEL: group, PURCHASE_LABEL: purchase}


def node_config(*, cluster_name: str, endpoint: str, certificate_authority: str, cidr: str,
                labels: Mapping[str, str], taints: Sequence[tuple[str, str, str]] = (GPU_TAINT,)) -> str:
    """The NodeConfig `nodeadm` joins the node with, as a YAML document."""
    flags = [f"--node-labels={','.join(f'{k}={v}' for k, v in labels.items())}"]
    if taints:
        flags.append(f"--register-with-taints={','.join(f'{k}={v}:{e}' for k, v, e in taints)}")
    document = {
        "apiVersion": NODE_CONFIG_API_VERSION, "kind": "NodeConfig",
        "spec": {"cluster": {"name": cluster_name, "apiServerEndpoint": endpoint,
                             "certificateAuthority": certificate_authority, "cidr": cidr},
                 "kubelet": {"flags": flags}},
    }
    return "---\n" + yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=1000)


def _node_config_part(document: str) -> str:
    return f"--{BOUNDARY}\nContent-Type: {NODE_CONFIG_CONTENT_TYPE}\n\n{document}\n"
