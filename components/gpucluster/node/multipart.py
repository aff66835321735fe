"""A node's user data as a MIME multi-part document: what AWS PCS needs of a custom launch template.

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
"""

from __future__ import annotations

import base64
import gzip
import textwrap

# A line no script of ours holds (multipart_document refuses one that does).
BOUNDARY = "==GPUCLUSTER-BOUNDARY=="
# What AWS PCS adds to the document (its own part: the PCS agent's registration) is not documented as a
# size: 1,024 bytes are kept free of our part, for a few lines of cloud-config; a larger PCS part would
# make a launch fail on EC2's 16 KiB (ledger: pcs-user-data-reserve).
PCS_USER_DATA_BYTES = 1024


def _head(script: str) -> str:
    charset = "us-ascii" if script.isascii() else "utf-8"
    return ("MIME-Version: 1.0\n"
            f'Content-Type: multipart/mixed; boundary="{BOUNDARY}"\n\n'
            f"--{BOUNDARY}\n"
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


def multipart_document(script: str) -> str:
    """`script`, self-extracting, as the one `text/x-shellscript` part of a multipart/mixed document."""
    if f"--{BOUNDARY}" in script:
        raise ValueError(f"the node script holds the MIME boundary --{BOUNDARY}")
    part = self_extracting(script)
    return _head(part) + part + _TAIL


def multipart_size(script: str) -> int:
    """Bytes of the document for `script`: what EC2 counts against its 16 KiB (the raw user data, before
    the launch template's own base64)."""
    return len(multipart_document(script).encode())


def encode_multipart_user_data(script: str, limit: int) -> str:
    """The document, base64-encoded as a launch template's user data; ValueError past `limit` bytes."""
    document = multipart_document(script).encode()
    if len(document) > limit:
        raise ValueError(f"user data is {len(document)} bytes as a MIME multi-part document; "
                         f"EC2 allows {limit}")
    return base64.b64encode(document).decode()
