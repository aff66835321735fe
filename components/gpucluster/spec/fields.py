"""The field types of the stack-file language: validators (`_check_cidr`, `_check_cron`, ...) and the
`Annotated` types built from them (`Name`, `Cron`, `BucketName`, ...), and the deployment identity.

Each validator checks one value alone and raises `ValueError` with the message a user reads. It
must never look at another field (that is a named check) nor import Pulumi, AWS or the models.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import math
import re
from typing import Annotated, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator

from gpucluster import catalog
from gpucluster.fleet.tags import CLUSTER_TAG, STACK_TAG
from gpucluster.spec.findings import shown

PROJECT = "gpucluster"
REGION_KEY = "aws:region"
ORGANIZATION_KEY = f"{PROJECT}:organization"


# ------------------------------------------------------------------ field validators


def number_text(value: float) -> str:
    """140.0 -> '140', 2.5 -> '2.5', 10000000 -> '10000000' (never exponent notation); cut when huge."""
    if isinstance(value, int):
        return shown(value)
    return shown(int(value)) if math.isfinite(value) and value.is_integer() else shown(value)


def _in_range(lo: float, hi: float) -> AfterValidator:
    def check(value: float) -> float:
        if not lo <= value <= hi:
            raise ValueError(f"must be {number_text(lo)}..{number_text(hi)}, got {number_text(value)}")
        return value

    return AfterValidator(check)


def _off_or_in_range(lo: float, hi: float) -> AfterValidator:
    """0 (off) or a value in lo..hi."""
    def check(value: float) -> float:
        if value != 0 and not lo <= value <= hi:
            raise ValueError(f"must be 0 (off) or {number_text(lo)}..{number_text(hi)}, "
                             f"got {number_text(value)}")
        return value

    return AfterValidator(check)


def _matches(pattern: str, what: str) -> AfterValidator:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{what}, got {shown(value)}")
        return value

    return AfterValidator(check)


def _check_email(value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._%+'-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}", value):
        raise ValueError(f"not a valid e-mail address, got {shown(value)}")
    return value


def _check_instance_type(value: str) -> str:
    if catalog.get(value) is None:
        hint = difflib.get_close_matches(value, catalog.names(), n=1, cutoff=0.6)
        suggestion = f"; did you mean {hint[0]!r}?" if hint else ""
        raise ValueError(f"unknown instance type {shown(value)}{suggestion} (see `gpucluster "
                         "recommend` or catalog/data/instance_types.yaml)")
    return value


DATA_ROOTS = ("/data", "/fsx", "/scratch", "/mnt")
"""Where datasets and scratch may be mounted. A mount hides what lies below it and whoever
writes the bucket writes the directory: under /etc/cron.d, /usr/local/sbin or /root/.ssh
that would be root on every node."""
MAX_MOUNT_PATH_CHARS = 200


def _check_mount_path(value: str) -> str:
    """An absolute path at or under one of DATA_ROOTS, of plain segments (no '.', '..', '//')."""
    segments = value.removesuffix("/").split("/")
    if not value.startswith("/") or not re.fullmatch(r"[A-Za-z0-9._/-]*", value) \
            or any(part in ("", ".", "..") for part in segments[1:]) or len(value) > MAX_MOUNT_PATH_CHARS:
        raise ValueError(f"must be a plain absolute path (letters, digits, . _ - and /, no '.' or '..' "
                         f"segments, at most {MAX_MOUNT_PATH_CHARS} characters), got {shown(value)}")
    if len(segments) < 2 or "/" + segments[1] not in DATA_ROOTS:
        raise ValueError(f"must be at or under one of the data roots {', '.join(DATA_ROOTS)} (never "
                         f"a system directory), got {shown(value)}")
    return value


def _check_node_file_path(value: str) -> str:
    """A file's absolute path on a node, of plain segments (no '.', '..', '//', no trailing '/')."""
    segments = value.split("/")
    if not value.startswith("/") or not re.fullmatch(r"[A-Za-z0-9._/-]*", value) or len(value) > 255 \
            or any(part in ("", ".", "..") for part in segments[1:]):
        raise ValueError(f"must be a plain absolute file path (letters, digits, . _ - and /, no '.' or "
                         f"'..' segments, at most 255 characters), got {shown(value)}")
    return value


# S3 object keys hold 1024 bytes (S3 user guide, "Naming Amazon S3 objects"); leave room for names.
MAX_PREFIX_CHARS = 512


def _check_prefix(value: str) -> str:
    """A folder-like S3 prefix of characters IAM and S3 read literally.

    The prefix goes into IAM policy resources and `s3:prefix` conditions, where `*` and `?`
    are wildcards and `${...}` a policy variable (IAM user guide, "IAM JSON policy elements:
    Resource" and "Policy variables"), so those would grant more than the prefix.
    """
    if value.startswith("/"):
        raise ValueError(f"S3 prefixes do not start with '/', got {shown(value)}")
    if value and not value.endswith("/"):
        raise ValueError(f"must end with '/' (a folder-like prefix), got {shown(value)}")
    if not re.fullmatch(r"[A-Za-z0-9!_.'()/-]*", value):
        raise ValueError("must use letters, digits and ! - _ . ' ( ) / only (no * ? $ { } "
                         f"IAM would read as wildcards or variables), got {shown(value)}")
    if value and any(part in ("", ".", "..") for part in value[:-1].split("/")):
        raise ValueError(f"must be plain folder names (no '//', '.' or '..'), got {shown(value)}")
    if len(value) > MAX_PREFIX_CHARS:
        raise ValueError(f"must be at most {MAX_PREFIX_CHARS} characters, got {len(value)}")
    return value


# S3 user guide, "General purpose bucket naming rules": reserved prefixes and suffixes.
BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def _check_bucket_name(value: str) -> str:
    """S3 general purpose bucket naming rules (S3 user guide, "Bucket naming rules")."""
    problems = []
    if not 3 <= len(value) <= 63:
        problems.append("3-63 characters")
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]*[a-z0-9]", value):
        problems.append("lowercase letters, digits, '.' and '-', starting and ending with a "
                        "letter or digit")
    if ".." in value or ".-" in value or "-." in value:
        problems.append("no adjacent periods or period-hyphen pairs")
    if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", value):
        problems.append("not formatted as an IP address")
    if value.startswith(BUCKET_RESERVED_PREFIXES):
        problems.append("not starting with " + ", ".join(BUCKET_RESERVED_PREFIXES))
    if value.endswith(BUCKET_RESERVED_SUFFIXES):
        problems.append("not ending with a reserved suffix (" + ", ".join(BUCKET_RESERVED_SUFFIXES) + ")")
    if problems:
        raise ValueError(f"not a valid S3 bucket name ({'; '.join(problems)}), got {shown(value)}")
    return value


# pulumi-aws s3.Bucket `bucket_prefix`: at most 37 characters; the provider appends a unique suffix.
BUCKET_PREFIX_MAX = 37


def generated_bucket_prefix(cluster_name: str, dataset_name: str) -> str:
    """The `bucket_prefix` of a created bucket without a bucket_name: `<cluster>-<dataset>-`."""
    return f"{cluster_name}-{dataset_name}"[:BUCKET_PREFIX_MAX - 1] + "-"


CRON_FIELDS: list[tuple[str, int, int, dict[str, int]]] = [
    ("minutes", 0, 59, {}),
    ("hours", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, {m: i + 1 for i, m in enumerate(
        ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"])}),
    ("day-of-week", 1, 7, {d: i + 1 for i, d in enumerate(
        ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}),
    ("year", 1970, 2199, {}),
]


def _cron_value(token: str, lo: int, hi: int, names: dict[str, int]) -> int:
    value = names.get(token.upper()) if token.upper() in names else None
    if value is None:
        if not token.isdigit():
            raise ValueError(token)
        value = int(token)
    if not lo <= value <= hi:
        raise ValueError(token)
    return value


def _check_cron_field(text: str, lo: int, hi: int, names: dict[str, int], field: str) -> None:
    for part in text.split(","):
        base, _, step = part.partition("/")
        if step and (not step.isdigit() or int(step) == 0):
            raise ValueError(part)
        if base == "*":
            continue
        if field == "day-of-month" and re.fullmatch(r"L|LW|\d{1,2}W", base):
            continue
        if field == "day-of-week" and re.fullmatch(r"([1-7]|[A-Za-z]{3})(L|#[1-5])", base):
            _cron_value(re.split("[L#]", base)[0], lo, hi, names)
            continue
        start, _, end = base.partition("-")
        first = _cron_value(start, lo, hi, names)
        if end and _cron_value(end, lo, hi, names) < first and field != "day-of-week":
            raise ValueError(part)


def _check_cron(value: str) -> str:
    """An EventBridge cron expression: cron(min hour day-of-month month day-of-week year)."""
    match = re.fullmatch(r"cron\((.*)\)", value.strip())
    if not match:
        raise ValueError("must be an EventBridge cron expression like 'cron(0 20 ? * MON-FRI *)', "
                         f"got {shown(value)}")
    fields = match.group(1).split()
    if len(fields) != 6:
        raise ValueError(f"cron needs 6 fields (minutes hours day-of-month month day-of-week "
                         f"year), got {len(fields)} in {shown(value)}")
    for text, (field, lo, hi, names) in zip(fields, CRON_FIELDS, strict=True):
        if text == "?":
            if field not in ("day-of-month", "day-of-week"):
                raise ValueError(f"'?' is only allowed in day-of-month or day-of-week, in {shown(value)}")
            continue
        try:
            _check_cron_field(text, lo, hi, names, field)
        except ValueError as bad:
            raise ValueError(f"invalid {field} field {shown(text)} ({shown(str(bad))}) in "
                             f"{shown(value)}") from None
    if (fields[2] == "?") == (fields[4] == "?"):
        raise ValueError("exactly one of day-of-month and day-of-week must be '?' "
                         f"(EventBridge rule), in {shown(value)}")
    return value


def _check_timezone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown IANA time zone, got {shown(value)} (e.g. UTC, Europe/Berlin)") from None
    return value


def _check_cidr(value: str) -> str:
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError:
        raise ValueError(f"not an IPv4 CIDR block, got {shown(value)}") from None
    if not 16 <= net.prefixlen <= 22:
        raise ValueError(f"VPC CIDR must be /16../22 to fit the subnets, got /{net.prefixlen}")
    if not net.is_private:
        raise ValueError(f"VPC CIDR should be a private range (RFC 1918), got {shown(value)}")
    return value


def _on_off(value: Any) -> Any:
    """YAML 1.1 readers (PyYAML) turn `on`/`off` into booleans; Pulumi's YAML 1.2 does not."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


def _unique(what: str) -> AfterValidator:
    def check(values: list[Any]) -> list[Any]:
        dupes = sorted({str(v) for v in values if values.count(v) > 1})
        if dupes:
            raise ValueError(f"{what} must be unique, repeated: {', '.join(dupes)}")
        return values

    return AfterValidator(check)


# Tag keys AWS (aws:) and gpucluster (gpucluster:) set themselves. A user tag under them could
# forge what the guardrails read (a gpucluster:stopped-by with gpucluster:previous-desired makes the
# start schedule scale a group up), so no user tag map may hold one.
RESERVED_TAG_PREFIXES = ("aws:", "gpucluster:")
# The identity tags: components that take no `identity` receive them in their tags (from GpuCluster).
IDENTITY_TAG_KEYS = (STACK_TAG, CLUSTER_TAG)


def tag_key(allowed: tuple[str, ...] = ()) -> AfterValidator:
    """A user tag key: 1-128 safe characters, not under a reserved prefix (except `allowed` keys)."""

    def check(value: str) -> str:
        if not re.fullmatch(r"[\w .:/=+@-]{1,128}", value):
            raise ValueError("tag keys are 1-128 characters of letters, digits, spaces and "
                             f"_ . : / = + - @, got {value!r}")
        if value.lower().startswith(RESERVED_TAG_PREFIXES) and value not in allowed:
            raise ValueError(f"tag key {value!r} is reserved: keys under "
                             f"{' and '.join(RESERVED_TAG_PREFIXES)} are set by AWS and gpucluster only")
        return value

    return AfterValidator(check)


Percent = Annotated[float, _in_range(0, 100)]
Name = Annotated[str, _matches(r"[a-z][a-z0-9-]{0,22}[a-z0-9]",
                               "must be 2-24 characters of a-z, 0-9 and '-', starting with a "
                               "letter")]
TagValue = Annotated[str, _matches(r"[\w .:/=+@-]{1,256}",
                                   "must be 1-256 characters of letters, digits, spaces and "
                                   "_ . : / = + - @")]
Email = Annotated[str, AfterValidator(_check_email)]
InstanceTypeName = Annotated[str, AfterValidator(_check_instance_type)]
Cron = Annotated[str, AfterValidator(_check_cron)]
ZONE_NAME = re.compile(r"[a-z]{2}(-gov)?-[a-z]+-\d[a-z]")
AvailabilityZone = Annotated[str, _matches(ZONE_NAME.pattern,
                                           "must be an availability zone name like us-east-1a")]
MAX_COMMAND_BYTES = 2048


def _check_shell_command(value: str) -> str:
    """A hook command: any text bash takes, at most 2048 bytes.

    It travels in a Lambda environment, which holds 4 KB in all (Lambda developer guide,
    "Working with Lambda environment variables"), and in the node's user data, shell-quoted.
    """
    size = len(value.encode())
    if not value[:1].strip() or size > MAX_COMMAND_BYTES:
        raise ValueError(f"must be a non-empty shell command of at most {MAX_COMMAND_BYTES} bytes, "
                         f"starting with a non-space, got {size} bytes: {shown(value)}")
    return value


ShellCommand = Annotated[str, AfterValidator(_check_shell_command)]
# Pulumi's rule for stack names ("stack names are limited to 100 characters and may only
# contain alphanumeric, hyphens, underscores, or periods"): the name reaches tags, the
# Lambdas' environment and the user data's first comment line.
StackName = Annotated[str, _matches(r"[A-Za-z0-9._-]{1,100}",
                                    "a stack name (Pulumi.<stack>.yaml) is 1-100 letters, digits, "
                                    "'-', '_' or '.'")]
# IAM user guide, "IAM identifiers" / CreatePolicy and CreateRole: name characters and lengths.
PolicyName = Annotated[str, _matches(r"[\w+=,.@-]{1,128}", "must be an IAM policy name (1-128 "
                                     "letters, digits and + = , . @ _ -)")]
RoleName = Annotated[str, _matches(r"[\w+=,.@-]{1,64}", "must be an IAM role name (1-64 letters, "
                                   "digits and + = , . @ _ -)")]
AccountId = Annotated[str, _matches(r"\d{12}", "must be a 12-digit AWS account id")]
# An OpenPGP v4 primary key fingerprint as `gpg --show-keys` prints it (40 hex digits, no spaces).
KeyFingerprint = Annotated[str, _matches(r"[0-9A-F]{40}", "must be an OpenPGP key fingerprint: 40 "
                                         "upper-case hex digits without spaces")]
# The field rules of the models below, by name, for component Args that take one value alone.
AbsolutePath = Annotated[str, AfterValidator(_check_mount_path)]  # under DATA_ROOTS
S3Prefix = Annotated[str, AfterValidator(_check_prefix)]
BucketName = Annotated[str, AfterValidator(_check_bucket_name)]
Region = Annotated[str, _matches(r"[a-z]{2}(-gov)?-[a-z]+-\d", "must be a region like us-east-1")]
# A file of the user's project, relative to the directory holding Pulumi.yaml (read at plan/up time).
ProjectPath = Annotated[str, _matches(r"(?!/)(?!.*(^|/)\.\.(/|$))[A-Za-z0-9._/-]{1,255}",
                                      "must be a path relative to the project (the directory holding "
                                      "Pulumi.yaml), without '..'")]
# A container image reference: [registry[:port]/]repository[:tag][@digest] (no spaces or quotes).
ContainerImage = Annotated[str, _matches(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,254}",
                                         "must be an image reference like nvcr.io/nvidia/pytorch:24.12-py3, "
                                         "or pinned: <repository>:<tag>@sha256:<64 hex digits>")]


# ----------------------------------------------------------------------- identity

DIY_ORGANIZATION = "organization"
"""Pulumi's organization in a self-managed (DIY: file://, s3://, gs://, azblob://) backend: always this
constant (pulumi/pulumi PR #20008, "DIY backends have a single constant organization")."""
IDENTITY_MAX = 256
"""AWS tag values hold at most 256 characters (Tagging AWS resources, "Tag naming limits and requirements");
Budgets' TagKeyValue filter (`user:<key>$<value>`) and IAM `ResourceTag` conditions take the same value."""
_IDENTITY_HASH = 16
# Pulumi's own rule for project and stack names (alphanumerics, hyphens, underscores, periods; "Project
# file reference", "Stacks"), and what Pulumi Cloud organization names use: every character is also
# one AWS tags allow everywhere (letters, digits, spaces and + - = . _ : / @), so `/` can join them.
PULUMI_NAME = r"[A-Za-z0-9_.-]{1,100}"


def stack_identity(organization: str, project: str, stack: str, cluster: str) -> str:
    """The one identity of a deployment: `<organization>/<project>/<stack>/<cluster>`.

    Unique per deployment where the bare stack name is not: two teams' `dev` stacks in one account
    differ in their Pulumi organization or project, and two clusters of one stack in their name.
    Every guardrail, the budget's cost filter, the IAM conditions, the nodes and the CLI use this
    value, and nothing else computes it. Past AWS's 256-character tag limit the tail gives way to a
    hash of the whole (`+` and 16 hex digits), so it stays readable and unique.
    """
    full = "/".join((organization, project, stack, cluster))
    if len(full) <= IDENTITY_MAX:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:_IDENTITY_HASH]
    return f"{full[:IDENTITY_MAX - _IDENTITY_HASH - 1]}+{digest}"


def partition_of(region: str) -> str:
    """The ARN partition of a region (AWS general reference, "Amazon Resource Names")."""
    if region.startswith("cn-"):
        return "aws-cn"
    if region.startswith("us-gov-"):
        return "aws-us-gov"
    return "aws"
