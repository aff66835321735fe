"""A node's user data as a MIME multi-part document: what AWS PCS needs of a custom launch template.

AWS PCS launches a Slurm stack's nodes from our launch template and adds its own user data (the PCS
agent's registration) to ours, so ours must be a MIME multi-part document ("Using Amazon EC2 launch
templates with AWS PCS", https://docs.aws.amazon.com/pcs/latest/userguide/working-with_launch-templates.html;
ledger: pcs-launch-template-multipart). The node bootstrap (one bash script) goes in as one part,
gzipped and base64-encoded, typed `application/x-gzip`: cloud-init decodes a part's transfer encoding,
gunzips a part of a gzip type and then runs what it finds by its first line (`#!`: a shell script)
(cloud-init documentation, "User data formats": MIME multi-part archive, gzip compressed content;
ledger: cloud-init-gzip-part). The Auto Scaling path keeps its gzipped script
(`userdata.encode_user_data`), byte for byte. Pure: no Pulumi, no AWS call; the bytes are the same
for the same script (gzip mtime 0, a fixed boundary).
"""

from __future__ import annotations

import base64
import gzip
import textwrap

# Not a substring of any base64 text (which has no '=' but at its end and no '-' at all).
BOUNDARY = "==GPUCLUSTER-BOUNDARY=="
# What AWS PCS adds to the document (its own part: the PCS agent's registration) is not documented as a
# size: a reserve kept free of our part, for a few lines of cloud-config (ledger: pcs-user-data-reserve).
PCS_USER_DATA_BYTES = 1024
# MIME (RFC 2045, 6.8): base64 lines of at most 76 characters.
BASE64_LINE = 76
_HEAD = ("MIME-Version: 1.0\n"
         f'Content-Type: multipart/mixed; boundary="{BOUNDARY}"\n\n'
         f"--{BOUNDARY}\n"
         "Content-Type: application/x-gzip\n"
         "Content-Transfer-Encoding: base64\n"
         'Content-Disposition: attachment; filename="gpucluster-bootstrap.sh.gz"\n\n')
_TAIL = f"\n--{BOUNDARY}--\n"


def multipart_document(script: str) -> str:
    """`script` gzipped, base64 in 76-character lines, as the one part of a multipart/mixed document."""
    packed = base64.b64encode(gzip.compress(script.encode(), mtime=0)).decode()
    return _HEAD + "\n".join(textwrap.wrap(packed, BASE64_LINE)) + _TAIL


def multipart_size(gzipped_bytes: int) -> int:
    """Bytes of the document for a script that gzips to `gzipped_bytes`: what EC2 counts against its
    16 KiB (the raw user data, before the launch template's own base64)."""
    encoded = 4 * -(-gzipped_bytes // 3)
    lines = max(1, -(-encoded // BASE64_LINE))
    return len(_HEAD) + encoded + (lines - 1) + len(_TAIL)


def encode_multipart_user_data(script: str, limit: int) -> str:
    """The document, base64-encoded as a launch template's user data; ValueError past `limit` bytes."""
    document = multipart_document(script).encode()
    if len(document) > limit:
        raise ValueError(f"user data is {len(document)} bytes as a MIME multi-part document; "
                         f"EC2 allows {limit}")
    return base64.b64encode(document).decode()
