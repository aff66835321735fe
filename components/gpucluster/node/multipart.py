"""A node's user data as a MIME multi-part document: what AWS PCS needs of a custom launch template.

AWS PCS launches a Slurm stack's nodes from our launch template and adds its own user data (the PCS
agent's registration) to ours, so ours must be a MIME multi-part document whose parts are of the types
the PCS guide documents, `text/x-shellscript` or `text/cloud-config`, with a blank line before the
closing boundary ("Using Amazon EC2 launch templates with AWS PCS",
https://docs.aws.amazon.com/pcs/latest/userguide/working-with_launch-templates.html). The node bootstrap
(one bash script) goes in as one `text/x-shellscript` part, as it is: no gzip part (cloud-init reads
gzip, PCS does not document it). The Auto Scaling path keeps its gzipped script
(`userdata.encode_user_data`), byte for byte. Pure: no Pulumi, no AWS call; the bytes are the same for
the same script (a fixed boundary).
"""

from __future__ import annotations

import base64

# A line no script of ours holds (multipart_document refuses one that does).
BOUNDARY = "==GPUCLUSTER-BOUNDARY=="
# UNVERIFIED: what AWS PCS adds to the document (its own part: the PCS agent's registration) is not
# documented as a size anywhere we could check. 1,024 bytes are kept free of our part, from memory of
# its shape (a few lines of cloud-config); a larger PCS part would make a launch fail on EC2's 16 KiB.
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


def multipart_document(script: str) -> str:
    """`script` as the one `text/x-shellscript` part of a multipart/mixed document."""
    if f"--{BOUNDARY}" in script:
        raise ValueError(f"the node script holds the MIME boundary --{BOUNDARY}")
    body = script if script.endswith("\n") else script + "\n"
    return _head(script) + body + _TAIL


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
