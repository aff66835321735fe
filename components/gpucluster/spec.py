"""The typed stack configuration: every key a stack file may hold, and all its validation.

A stack file (`stacks/Pulumi.<env>.yaml`) holds `aws:region` and the keys
`gpucluster:cluster`, `network`, `node_groups`, `datasets`, `budget`,
`autostop` and `spot`. `parse_stack_config` turns that mapping into a frozen
`StackSpec` or raises `SpecError` listing every problem at once, each as
`<key path>: <message>`. Nothing else in the toolkit validates config; it
must never import Pulumi or call AWS, so the same checks run offline in
`gpucluster plan` and inside `pulumi up` before any resource is declared.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import inspect
import ipaddress
import json
import math
import re
import reprlib
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from typing import Annotated, Any, Literal, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from gpucluster import catalog
from gpucluster.lambdas.tags import CLUSTER_TAG, STACK_TAG
from gpucluster.noderole import (
    ROLE_INLINE_POLICIES_MAX_CHARS,
    dataset_grants,
    longest_bucket_name,
    longest_health_policy,
    node_inline_policies_chars,
    run_log_group_name,
)

PROJECT = "gpucluster"
REGION_KEY = "aws:region"
ORGANIZATION_KEY = f"{PROJECT}:organization"
MAX_BUDGET_NOTIFICATIONS = 10

# --------------------------------------------------------------------------- errors

# Bounds on any input, whatever its source (a stack file, PULUMI_CONFIG under `pulumi up`,
# a caller's dict): a hostile file ends in a short error within a second, never a hang,
# a traceback or megabytes of output.
MAX_INPUT_BYTES = 256 * 1024
"""A stack file (or one config value as JSON text); the shipped ones are about 3 KB."""
MAX_NESTING = 32
"""Mappings and lists inside each other; a stack file needs 7."""
MAX_VALUES = 10_000
"""Values in one stack's config, counted with every YAML alias expanded."""
MAX_NUMBER_CHARS = 100
"""Digits of one number (Python refuses to convert ints past 4300 digits)."""
SHOWN_CHARS = 60
"""A value echoed in an error is cut to this many characters."""
MAX_PATH_CHARS = 100
MAX_LINE_CHARS = 200
MAX_FINDINGS = 50


def clip(text: str, limit: int) -> str:
    """`text` on one printable line of at most `limit` characters (cut ones end in '…')."""
    if len(text) > 4 * limit:
        text = text[:4 * limit]
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def shown(value: Any) -> str:
    """A value as an error message echoes it: its repr, cut to SHOWN_CHARS characters."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"<a {value.bit_length()}-bit number>"  # repr() refuses ints past 4300 digits
    if isinstance(value, str):  # the quotes do not count
        return clip(repr(value[:SHOWN_CHARS + 1]), SHOWN_CHARS + 2)
    return clip(_SHORT_REPR.repr(value), SHOWN_CHARS)


_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxstring, _SHORT_REPR.maxother = 3, SHOWN_CHARS, SHOWN_CHARS
_SHORT_REPR.maxlong = 80


@dataclass(frozen=True)
class Finding:
    """One problem in a stack's config, at a key path such as `node_groups[0].max_nodes`.

    Path and message are cut on creation, so every consumer (terminal, JSON) gets one
    printable line of at most MAX_LINE_CHARS, however long the key or value was.
    """

    path: str
    message: str
    level: Literal["error", "warning"] = "error"

    def __post_init__(self) -> None:
        path = clip(str(self.path), MAX_PATH_CHARS)
        object.__setattr__(self, "path", path)
        object.__setattr__(self, "message", clip(str(self.message), MAX_LINE_CHARS - len(path) - 2))

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """Invalid stack config; `findings` holds the errors, one line each in `str()`.

    At most MAX_FINDINGS are kept (the last one says how many more there were).
    """

    def __init__(self, findings: list[Finding]) -> None:
        if len(findings) > MAX_FINDINGS:
            more = len(findings) - MAX_FINDINGS + 1
            findings = [*findings[:MAX_FINDINGS - 1],
                        Finding("…", f"{more} more problems not shown; fix the ones above first")]
        self.findings = findings
        super().__init__("\n".join(str(f) for f in findings))


# ------------------------------------------------------------------ field validators


def _num(value: float) -> str:
    """140.0 -> '140', 2.5 -> '2.5', 10000000 -> '10000000' (never exponent notation); cut when huge."""
    if isinstance(value, int):
        return shown(value)
    return shown(int(value)) if math.isfinite(value) and value.is_integer() else shown(value)


def _in_range(lo: float, hi: float) -> AfterValidator:
    def check(value: float) -> float:
        if not lo <= value <= hi:
            raise ValueError(f"must be {_num(lo)}..{_num(hi)}, got {_num(value)}")
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
                                         "must be an image reference like nvcr.io/nvidia/pytorch:24.12-py3")]


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


class StrictModel(BaseModel):
    """Unknown keys are errors; specs are immutable once validated.

    A field's docstring (the string under it) documents it: `field_docs` reads them when the
    reference or a schema needs them. Not pydantic's `use_attribute_docstrings`, which parses
    every model's source at import (a fifth of importing this module, on every command).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


@cache
def field_docs(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> its docstring, the model's own over its bases' (as `use_attribute_docstrings`
    would set `description`): an annotated assignment followed by a string, cleaned like a docstring."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or cls is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        except (OSError, TypeError):  # no source (built at run time): no docstrings
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return {name: docs[name] for name in model.model_fields if name in docs}


# ------------------------------------------------------------------------- models


class CostTags(StrictModel):
    """The cost tags every resource carries (activate them as cost-allocation tags to see costs by them)."""

    owner: TagValue
    """Team or person accountable for the cluster (tag `owner`)."""
    cost_center: TagValue
    """Cost centre for your bills (tag `cost_center`; the budget filters on `gpucluster:stack`)."""
    environment: Annotated[str, _matches(r"[a-z][a-z0-9-]{0,31}",
                                         "must be lowercase like dev, staging or prod")]
    """`prod` gets the production policies; anything else is non-prod."""


class ClusterConfig(StrictModel):
    name: Name
    """Short name used in every resource name; the stack name is added to tags."""
    tags: CostTags
    """Required cost tags: owner, cost_center, environment."""
    extra_tags: dict[Annotated[str, tag_key()], TagValue] = {}
    """More tags for every resource (team, project, ...); keys under aws: and gpucluster: are reserved."""
    permissions_boundary: PolicyName | None = None
    """Policy name: the permissions boundary of every IAM role the stack creates (none by default)."""
    break_glass_role: RoleName | None = None
    """The only role that may delete versions in, or delete, the dataset buckets the stack creates."""


class NetworkConfig(StrictModel):
    availability_zones: Annotated[list[AvailabilityZone], Field(min_length=1, max_length=6),
                                  _unique("availability zones")]
    """Zones the cluster may use; EFA groups use exactly one of them."""
    vpc_cidr: Annotated[str, AfterValidator(_check_cidr)] | None = None
    """Create a VPC with this CIDR (private subnets, NAT, S3/SSM endpoints)."""
    nat_gateway: bool = True
    """Internet egress for nodes through one NAT gateway (created VPCs only)."""
    existing_vpc_id: Annotated[str, _matches(r"vpc-[0-9a-f]{8,17}",
                                             "must be a VPC id like vpc-0abc12345def67890")] | None = None
    """Use this VPC instead of creating one."""
    existing_subnets: dict[AvailabilityZone, Annotated[str, _matches(
        r"subnet-[0-9a-f]{8,17}", "must be a subnet id like subnet-0abc12345def67890")]] = {}
    """With existing_vpc_id: the private subnet to use in each availability zone."""


CapacityMarket = Literal["mixed", "capacity_block"]


class CapacityConfig(StrictModel):
    market: CapacityMarket = "mixed"
    """`mixed`: on-demand base + spot above it; `capacity_block`: a purchased Capacity Block."""
    on_demand_base: Annotated[int, _in_range(0, 2000)] = 0
    """Nodes always bought on-demand (or from a reservation) before any spot."""
    spot_percent: Percent = 0
    """Share of nodes above the base that are spot, 0..100."""
    spot_allocation_strategy: Literal["price-capacity-optimized", "capacity-optimized",
                                      "capacity-optimized-prioritized",
                                      "lowest-price"] = "price-capacity-optimized"
    """How the ASG picks spot pools (AWS Auto Scaling allocation strategies)."""
    on_demand_allocation_strategy: Literal["prioritized", "lowest-price"] = "prioritized"
    """`prioritized` follows instance_types order for on-demand nodes."""
    base_commitment: Literal["none", "savings_plan", "reserved_instances"] = "none"
    """How the on-demand base is paid for; used by the cost model."""
    capacity_reservation_id: Annotated[str, _matches(
        r"cr-[0-9a-f]{8,17}", "must be a capacity reservation id like cr-0abc12345def67890")] | None = None
    """Targeted on-demand capacity reservation, or the Capacity Block's reservation id."""
    duration_hours: Annotated[int, _in_range(24, 4368)] | None = None
    """capacity_block only: the block's length in hours; the cost model prices the block for it."""


class NodeFileConfig(StrictModel):
    path: Annotated[str, AfterValidator(_check_node_file_path)]
    """Where the file goes on every node of the group, e.g. /opt/gpucluster/hooks/drain.sh."""
    content: str | None = None
    """The file's text, written as is."""
    source: ProjectPath | None = None
    """Instead of content: a file of the project (relative to the directory holding Pulumi.yaml)."""
    mode: Annotated[str, _matches(r"0?[0-7]{3}", "must be octal permissions like 0644 or 0755")] = "0644"
    """Permissions, e.g. 0755 for a script a hook command runs."""


HealthFinding = Literal["gpu_count", "ecc", "page_retirement", "xid", "efa", "dcgm", "mig"]
"""What a node health check can find: too few GPUs visible to the driver, uncorrectable ECC errors,
a pending page retirement or row remap, an XID error, fewer EFA devices than the launch template
has, a failed DCGM quick diagnostic, or (MIG groups) a GPU not in MIG mode or without exactly the MIG
devices of the group's layout (`gpucluster.node` health-check.sh)."""
HEALTH_FINDINGS: tuple[str, ...] = get_args(HealthFinding)
# NVIDIA's k8s-device-plugin (internal/rm/health.go) leaves these XIDs out of its GPU health: they
# are raised by an application's own fault (13 graphics engine exception, 31 MMU fault, 43 GPU
# stopped processing, 45 preemptive cleanup, 68 video processor exception, 109 context switch
# timeout), and the GPU keeps working for other processes.
APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
# How long a new node has to answer its launch check. A MIG group's first boot can be two: MIG mode
# on, a reboot where the GPU reset cannot take it (an A100 passed through to a VM: MIG user guide,
# "Enable MIG Mode"), the layout again, then the check; gpucluster-mig.service alone may take 20 min.
# Its default covers two boots of the plain default and the GPU resets; below its minimum (two plain
# boots) a node that needs the reboot would be abandoned, and every replacement with it. Estimates:
# not timed on AWS.
LAUNCH_TIMEOUT_MINUTES = 15
MIG_LAUNCH_TIMEOUT_MINUTES = 40
MIG_MIN_LAUNCH_TIMEOUT_MINUTES = 30


class HealthCheckConfig(StrictModel):
    enabled: bool = True
    """Check every node before it joins (launch lifecycle hook) and every interval_minutes after."""
    interval_minutes: Annotated[int, _in_range(1, 60)] = 5
    """How often a running node checks itself."""
    launch_timeout_minutes: Annotated[int, _in_range(5, 120)] | None = None
    """A new node that has not answered the launch check by then is abandoned; default 15, 40 with mig."""
    xid_window_minutes: Annotated[int, _in_range(1, 1440)] = 15
    """A running node counts XID errors of the last this many minutes (at launch: since boot)."""
    ignored_xids: Annotated[list[Annotated[int, _in_range(1, 999)]], Field(max_length=64),
                            _unique("ignored XIDs")] = list(APPLICATION_XIDS)
    """XIDs that are an application's fault, not the GPU's (default: NVIDIA device plugin's list)."""
    fatal: Annotated[list[HealthFinding], _unique("fatal findings")] = list(HEALTH_FINDINGS)
    """Findings that fail a node; the others are only reported."""
    on_failure: Literal["replace", "notify"] = "replace"
    """replace: abandon a failing new node, mark a failing running node Unhealthy; notify: report only."""
    dcgm_diag: bool = True
    """Run DCGM's quick diagnostic (`dcgmi diag -r 1`) at launch where dcgmi is installed (not with mig)."""
    stuck_alarm_minutes: Annotated[int, _in_range(10, 1440)] | None = None
    """Notify when GPUs stay busy-but-flat, or nodes in service publish no GPU metric, this long."""


MIG_PROFILE = r"[1-7]g\.\d{1,3}gb(\+me)?"
MigProfileName = Annotated[str, _matches(MIG_PROFILE, "must be a MIG profile name like 1g.10gb or 3g.40gb")]


class MigConfig(StrictModel):
    """The MIG instances every GPU of a node group is split into: one profile `count` times, or a list."""

    profile: MigProfileName | None = None
    """Split every GPU into instances of this profile, e.g. 1g.10gb (README, "MIG partitions")."""
    count: Annotated[int, _in_range(1, 7)] | None = None
    """With profile: instances per GPU (default: as many as fit, e.g. 7 x 1g.10gb on an H100)."""
    profiles: Annotated[list[MigProfileName], Field(min_length=1, max_length=7)] | None = None
    """Instead of profile: the instances of each GPU, e.g. [3g.40gb, 2g.20gb, 1g.10gb, 1g.10gb]."""


class NodeGroupConfig(StrictModel):
    name: Name
    """Unique within the stack; used in resource names and the ASG tag."""
    instance_types: Annotated[list[InstanceTypeName], Field(min_length=1, max_length=20),
                              _unique("instance types")]
    """Preference order: the first is tried first; the rest are fallbacks."""
    min_nodes: Annotated[int, _in_range(0, 2000)] = 0
    """The Auto Scaling group minimum, set at creation; afterwards the guardrails own it (see Guardrails)."""
    desired_nodes: Annotated[int, _in_range(0, 2000)] = 0
    """Nodes at creation; later changed by guardrails and users, not by Pulumi."""
    max_nodes: Annotated[int, _in_range(1, 2000)]
    """The Auto Scaling group maximum (and what the cost model prices at worst)."""
    availability_zones: Annotated[list[AvailabilityZone], Field(min_length=1),
                                  _unique("availability zones")] | None = None
    """Default: the network's first zone for EFA groups, all its zones otherwise."""
    capacity: CapacityConfig = CapacityConfig()
    """The on-demand / spot / reservation mix."""
    efa: Annotated[Literal["auto", "on", "off"], BeforeValidator(_on_off)] = "auto"
    """auto: on when every type supports EFA and the group can have more than one node."""
    placement_group: bool | None = None
    """A cluster placement group; default: on for EFA groups not using a reservation or Capacity Block."""
    scratch_mount: Annotated[str, AfterValidator(_check_mount_path)] = "/scratch"
    """Where the RAID0 of the NVMe instance-store disks is mounted."""
    root_volume_size_gib: Annotated[int, _in_range(50, 16384)] = 200
    """Encrypted gp3 root volume size."""
    ami_id: Annotated[str, _matches(r"ami-[0-9a-f]{8,17}",
                                    "must be an AMI id like ami-0abc12345def67890")] | None = None
    """Pin an AMI instead of the Deep Learning AMI; set or change it to upgrade a group's AMI."""
    ami_ssm_parameter: Annotated[str, _matches(r"/[\w./-]+", "must be an SSM parameter path "
                                               "starting with /")] | None = None
    """Another SSM parameter to read the AMI from; read once, when the group is created."""
    files: list[NodeFileConfig] = []
    """Files written on every node at boot, before setup runs (e.g. the hook a pre_stop_command names)."""
    setup: list[ShellCommand] = []
    """Commands run once per node as root after the bootstrap, in order (unit gpucluster-setup)."""
    setup_script: ProjectPath | None = None
    """Instead of setup: a script of the project run the same way (relative to Pulumi.yaml's directory)."""
    container_image: ContainerImage | None = None
    """Pulled at boot (Docker; ECR login for ECR images) so the first job does not wait for it."""
    health_checks: HealthCheckConfig = HealthCheckConfig()
    """GPU health checks at launch and while running, and what a failing node gets."""
    mig: MigConfig | None = None
    """Split every GPU into MIG instances at boot (A100, H100, H200, B200); jobs get one per rank."""

    @property
    def types(self) -> list[catalog.InstanceType]:
        return [t for name in self.instance_types if (t := catalog.get(name))]

    @property
    def mig_layout(self) -> tuple[str, ...]:
        """The MIG instances of each GPU, as the stack file names them (empty: MIG off).

        `profile` without `count` takes as many as fit the group's GPU (the `group_mig`
        check makes sure every type of the group agrees on that number).
        """
        m = self.mig
        if m is None:
            return ()
        if m.profiles is not None:
            return tuple(m.profiles)
        if m.profile is None:
            return ()
        if m.count is not None:
            return (m.profile,) * m.count
        for t in self.types:
            gpu = catalog.mig_gpu(t.name)
            if gpu is not None and m.profile in gpu.profiles:
                return (m.profile,) * gpu.profiles[m.profile].max_instances
        return ()

    @property
    def launch_timeout_minutes(self) -> int:
        """`health_checks.launch_timeout_minutes`, or its default: longer for a MIG group (a reboot)."""
        if self.health_checks.launch_timeout_minutes is not None:
            return self.health_checks.launch_timeout_minutes
        return MIG_LAUNCH_TIMEOUT_MINUTES if self.mig is not None else LAUNCH_TIMEOUT_MINUTES

    @property
    def slots_per_gpu(self) -> int:
        """Devices a job sees per GPU: its MIG instances, or 1 (the whole GPU)."""
        return len(self.mig_layout) or 1

    @property
    def efa_enabled(self) -> bool:
        """Resolved EFA: `auto` is on only where every type has EFA and nodes can be > 1."""
        if self.efa == "auto":
            return self.max_nodes > 1 and all(t.supports_efa for t in self.types)
        return self.efa == "on"

    @property
    def uses_placement_group(self) -> bool:
        """`placement_group`, or by default: EFA groups that launch neither into a reservation nor a block.

        A reservation's instances sit where the reservation was made: a new placement group would
        leave launches short of it (eksctl #7949, terraform-aws-eks #3730), so groups targeting
        one get a placement group only when asked. A Capacity Block never gets one.
        """
        if self.placement_group is not None:
            return self.placement_group
        cap = self.capacity
        return self.efa_enabled and cap.market != "capacity_block" and cap.capacity_reservation_id is None


class FsxConfig(StrictModel):
    deployment_type: Literal["SCRATCH_2", "PERSISTENT_2"] = "SCRATCH_2"
    """SCRATCH_2 for short jobs; PERSISTENT_2 keeps data through failures (both Lustre 2.15)."""
    storage_capacity_gib: Annotated[int, _in_range(1200, 1_200_000)] = 1200
    """1200, or a multiple of 2400 (FSx for Lustre SCRATCH_2 / PERSISTENT_2 rule)."""
    throughput_per_unit_mib: Literal[125, 250, 500, 1000] | None = None
    """PERSISTENT_2 only: MB/s per TiB of storage."""
    availability_zone: AvailabilityZone | None = None
    """Default: the zone of the first node group; must be a zone a node group runs in."""
    mount_path: Annotated[str, AfterValidator(_check_mount_path)] = "/fsx"
    """Where nodes mount it: the data prefix at <mount_path>/data, checkpoints at .../checkpoints."""
    automatic_backup_retention_days: Annotated[int, _in_range(0, 90)] = 7
    """PERSISTENT_2 only: days of daily automatic backups kept (1-90; SCRATCH_2 has no backups)."""
    client_key_fingerprints: Annotated[list[KeyFingerprint], Field(max_length=4)] = []
    """Pins AWS's Lustre client apt key: nodes install the client only if each key in it is one of these."""


class DatasetConfig(StrictModel):
    name: Name
    """Unique within the stack; used in resource names."""
    bucket_name: Annotated[str, AfterValidator(_check_bucket_name)] | None = None
    """Created buckets: optional (Pulumi adds a unique suffix); existing: required."""
    existing: bool = False
    """Use an existing bucket; read-only unless checkpoint_prefix is set."""
    prefix: Annotated[str, AfterValidator(_check_prefix)] = ""
    """The data the nodes read."""
    checkpoint_prefix: Annotated[str, AfterValidator(_check_prefix)] | None = None
    """Where nodes write checkpoints, e.g. `checkpoints/` (the only prefix nodes may write)."""
    access: Literal["copy_to_scratch", "mount", "fsx"] = "mount"
    """How the data reaches the GPUs: copy to NVMe at boot, Mountpoint for S3, or FSx for Lustre."""
    mount_path: Annotated[str, AfterValidator(_check_mount_path)] | None = None
    """Where `mount` mounts the bucket (default /data/<name>)."""
    fsx: FsxConfig | None = None
    """FSx for Lustre linked to the bucket (with access: fsx)."""
    noncurrent_version_expiration_days: Annotated[int, _in_range(1, 3650)] = 30
    """Created buckets: old versions under checkpoint_prefix expire after this; current ones never do."""
    expected_bucket_owner: AccountId | None = None
    """Existing buckets: the account that must own it (default: the deploying account)."""
    newer_noncurrent_versions: Annotated[int, _in_range(1, 100)] = 3
    """Created buckets: this many newest old versions of each checkpoint are kept whatever their age."""


class BudgetConfig(StrictModel):
    monthly_limit_usd: Annotated[float, _in_range(1, 10_000_000)]
    """Monthly cost budget for resources tagged with this stack."""
    alert_thresholds_percent: Annotated[list[Annotated[float, _in_range(1, 1000)]],
                                        Field(min_length=1, max_length=10)] = [50, 80, 100]
    """Actual-spend alerts, ascending; a forecast alert at 100 % is always added."""
    emails: Annotated[list[Email], Field(max_length=10), _unique("e-mails")] = []
    """AWS Budgets allows at most 10 e-mail subscribers per notification."""
    action_threshold_percent: Annotated[float, _in_range(1, 1000)] | None = None
    """At this share of the limit every node group is scaled to zero (never deleted)."""
    report: Literal["weekly", "monthly"] | None = None
    """Opt-in spend report to the guardrail topic: Mondays, or the month's last day (08:00 UTC)."""


class AutoStopConfig(StrictModel):
    enabled: bool = True
    """Create the idle alarms, schedules and the auto-stop Lambda."""
    idle_minutes: Annotated[int, _in_range(5, 1440)] = 60
    """GPU utilisation must stay below the threshold this long before a group is stopped."""
    gpu_utilization_threshold_percent: Annotated[float, _in_range(1, 100)] = 5
    """Idle when even the group's busiest GPU stays below this (CloudWatch Maximum)."""
    stop_schedule: Cron | None = None
    """EventBridge cron, e.g. cron(0 20 ? * MON-FRI *): scale every group to zero."""
    start_schedule: Cron | None = None
    """EventBridge cron: restore groups the stop schedule stopped."""
    schedule_timezone: Annotated[str, AfterValidator(_check_timezone)] = "UTC"
    """IANA time zone the schedules are read in."""
    max_lifetime_hours: Annotated[int, _in_range(1, 8760)] | None = None
    """Stop a group whose oldest node has run this long."""
    pre_stop_command: ShellCommand | None = None
    """Run on every node (through SSM) before a stop, e.g. to checkpoint."""
    pre_stop_timeout_seconds: Annotated[int, _in_range(10, 840)] = 300
    """Bounded wait for the pre-stop hook; the auto-stop Lambda has 15 minutes in all."""


class SpotConfig(StrictModel):
    interruption_command: ShellCommand | None = None
    """Run on a node when AWS warns it of a spot interruption (2 minutes' notice)."""
    interruption_timeout_seconds: Annotated[int, _in_range(5, 110)] = 90
    """Bounded wait for the hook; the warning comes 2 minutes ahead."""
    handle_rebalance: bool = True
    """Also run the hook on the earlier EC2 Instance Rebalance Recommendation."""


class StackConfig(StrictModel):
    """Everything under the `gpucluster:` namespace of a stack file."""

    cluster: ClusterConfig
    """Name and tags."""
    network: NetworkConfig
    """A new VPC or an existing one, and the availability zones."""
    node_groups: Annotated[list[NodeGroupConfig], Field(min_length=1, max_length=20)]
    """GPU node groups, each an Auto Scaling group."""
    datasets: list[DatasetConfig] = []
    """S3 datasets and how they reach the GPUs."""
    budget: BudgetConfig | None = None
    """Monthly budget, alerts and the scale-to-zero action."""
    autostop: AutoStopConfig = AutoStopConfig(enabled=False)
    """Idle stop, schedules, maximum lifetime and the pre-stop hook (off when absent)."""
    spot: SpotConfig = SpotConfig()
    """The spot-interruption hook."""


PulumiName = Annotated[str, _matches(PULUMI_NAME, "must be 1-100 characters of letters, digits, "
                                     "'-', '_' and '.' (a Pulumi name)")]


class StackSpec(StackConfig):
    """A validated stack: its config plus where it is deployed (organization, project, stack) and region."""

    stack: StackName
    project: PulumiName = PROJECT
    organization: PulumiName = DIY_ORGANIZATION
    """The Pulumi organization (`gpucluster:organization`; a self-managed backend's is `organization`)."""
    region: Region

    @property
    def identity(self) -> str:
        """This deployment's identity (`stack_identity`): the `gpucluster:stack` tag value."""
        return stack_identity(self.organization, self.project, self.stack, self.cluster.name)

    def azs_of(self, group: NodeGroupConfig) -> list[str]:
        """The zones a node group runs in (one for EFA groups unless set otherwise)."""
        if group.availability_zones:
            return list(group.availability_zones)
        zones = self.network.availability_zones
        return [zones[0]] if group.efa_enabled or group.uses_placement_group else list(zones)

    @property
    def node_group_zones(self) -> set[str]:
        return {az for group in self.node_groups for az in self.azs_of(group)}

    @property
    def tags(self) -> dict[str, str]:
        """Tags for every resource: cost tags, extra tags and the deployment's identity."""
        return {
            **self.cluster.extra_tags,
            "owner": self.cluster.tags.owner,
            "cost_center": self.cluster.tags.cost_center,
            "environment": self.cluster.tags.environment,
            STACK_TAG: self.identity,
            CLUSTER_TAG: self.cluster.name,
        }


# ------------------------------------------------------------- cross-field checks

Check = Callable[[StackSpec], Iterable[Finding]]
CHECKS: list[Check] = []


def check(fn: Check) -> Check:
    """Register a cross-field check; each is small, named, and reports all it finds."""
    CHECKS.append(fn)
    return fn


@check
def zones_in_region(spec: StackSpec) -> Iterable[Finding]:
    yield from zone_region_findings(spec.network.availability_zones, spec.region)


def zone_region_findings(zones: Sequence[str], region: str, path: str = "network.availability_zones",
                         region_key: str = REGION_KEY) -> Iterable[Finding]:
    """Every zone lies in the region."""
    for i, az in enumerate(zones):
        if not az.startswith(region) or len(az) != len(region) + 1:
            yield Finding(f"{path}[{i}]", f"{az!r} is not a zone of region {region!r} ({region_key})")


@check
def network_source(spec: StackSpec) -> Iterable[Finding]:
    yield from network_findings(spec.network)


def network_findings(net: NetworkConfig, path: str = "network",
                     subnets_key: str = "existing_subnets") -> Iterable[Finding]:
    """A created or an existing VPC, and for an existing one a subnet in each zone, no more."""
    subnets = join_path(path, subnets_key)
    zones = join_path(path, "availability_zones")
    if (net.vpc_cidr is None) == (net.existing_vpc_id is None):
        yield Finding(path or "existing_vpc_id",
                      "set exactly one of vpc_cidr (create a VPC) or existing_vpc_id")
    if net.existing_vpc_id:
        for az in net.availability_zones:
            if az not in net.existing_subnets:
                yield Finding(subnets, f"no subnet given for availability zone {az!r}")
        for az in net.existing_subnets:
            if az not in net.availability_zones:
                yield Finding(f"{subnets}.{az}", f"zone is not listed in {zones}")
    elif net.existing_subnets:
        yield Finding(subnets, "only used with existing_vpc_id")


def join_path(prefix: str, key: str) -> str:
    """`network` + `vpc_cidr` -> `network.vpc_cidr`; an empty prefix gives the key alone."""
    return f"{prefix}.{key}" if prefix else key


@check
def node_group_names_unique(spec: StackSpec) -> Iterable[Finding]:
    yield from unique_name_findings([g.name for g in spec.node_groups], "node_groups", "node group")


def unique_name_findings(names: Sequence[str], path: str, what: str) -> Iterable[Finding]:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            yield Finding(f"{path}[{i}].name", f"duplicate {what} name {name!r}")
        seen.add(name)


# Per-group rules: each takes one group, the zones it runs in (None where they are not known,
# e.g. a GpuNodeGroup handed subnet ids that are Outputs) and the key path of the group.
GroupCheck = Callable[[NodeGroupConfig, "Sequence[str] | None", str], Iterable[Finding]]
GROUP_CHECKS: list[GroupCheck] = []


def group_check(fn: GroupCheck) -> GroupCheck:
    """Register a per-group rule: run alone on a GpuNodeGroup's args, and, as a stack check in its
    place among the others, on every node group of a stack."""
    GROUP_CHECKS.append(fn)
    CHECKS.append(lambda spec: _each_group(spec, fn))
    return fn


def node_group_findings(group: NodeGroupConfig, zones: Sequence[str] | None,
                        path: str = "node_group") -> list[Finding]:
    """Every per-group rule on one group alone (a GpuNodeGroup's own args)."""
    return [f for rule in GROUP_CHECKS for f in rule(group, zones, path)]


def _each_group(spec: StackSpec, rule: GroupCheck) -> Iterable[Finding]:
    for i, g in enumerate(spec.node_groups):
        yield from rule(g, spec.azs_of(g), f"node_groups[{i}]")


@group_check
def group_counts(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    if not g.min_nodes <= g.desired_nodes <= g.max_nodes:
        yield Finding(path, f"need min_nodes <= desired_nodes <= max_nodes, got "
                      f"{g.min_nodes} <= {g.desired_nodes} <= {g.max_nodes}")
    if g.capacity.on_demand_base > g.max_nodes:
        yield Finding(f"{path}.capacity.on_demand_base",
                      f"must be <= max_nodes ({g.max_nodes}), got {g.capacity.on_demand_base}")



@check
def node_group_zones(spec: StackSpec) -> Iterable[Finding]:
    for i, g in enumerate(spec.node_groups):
        yield from group_zone_findings(g.availability_zones or [], spec.network.availability_zones,
                                       f"node_groups[{i}]")


def group_zone_findings(group_zones: Sequence[str], network_zones: Sequence[str], path: str,
                        network_key: str = "network.availability_zones") -> Iterable[Finding]:
    """A group runs only in zones the network has."""
    for j, az in enumerate(group_zones):
        if az not in network_zones:
            yield Finding(f"{path}.availability_zones[{j}]", f"{az!r} is not in {network_key}")


@group_check
def group_efa(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """EFA on: every type supports it, all share one NIC layout, one zone, one subnet."""
    if g.efa == "on":
        for j, t in enumerate(g.types):
            if not t.supports_efa:
                yield Finding(f"{path}.instance_types[{j}]",
                              f"{t.name} does not support EFA (efa: on); use efa: off or an "
                              "EFA-capable type")
    if g.efa_enabled:
        layouts = {(t.network_cards, t.efa_interface_count) for t in g.types}
        if len(layouts) > 1:
            yield Finding(f"{path}.instance_types",
                          "EFA groups share one launch template, so every type needs the same "
                          "network cards and EFA interfaces; got " + ", ".join(
                              f"{t.name}={t.efa_interface_count}" for t in g.types))
    yield from single_zone_findings(g.efa_enabled, bool(g.placement_group), zones, path)


def single_zone_findings(efa: bool, placement_group: bool, zones: Sequence[str] | None,
                         path: str) -> Iterable[Finding]:
    """EFA and cluster placement groups live in one availability zone (and one subnet)."""
    if zones is None:
        return
    if efa and len(zones) != 1:
        yield Finding(f"{path}.availability_zones",
                      "EFA needs exactly one availability zone and subnet (cluster "
                      f"placement group); got {len(zones)}")
    if placement_group and len(zones) != 1:
        yield Finding(f"{path}.placement_group",
                      "a cluster placement group lives in one availability zone; "
                      f"the group has {len(zones)}")



def _zones_text(zones: Sequence[str]) -> str:
    return ", ".join(zones) if zones else "none"


def _regions_text(region: str, offered: Mapping[str, Sequence[str]], shown_at_most: int = 2) -> str:
    """Regions offering a type, those of `region`'s geography first (us-, eu-, ...), a few by name:
    an error line stays readable (MAX_LINE_CHARS) however many regions there are."""
    geography = region.split("-", 1)[0]
    regions = sorted((r for r, zones in offered.items() if zones),
                     key=lambda r: (r.split("-", 1)[0] != geography, r))
    if not regions:
        return "none"
    more = len(regions) - shown_at_most
    return ", ".join(regions[:shown_at_most]) + (f" and {more} more regions" if more > 0 else "")


@group_check
def group_offered(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """The first type is offered in every zone of the group (error); each fallback too (warning).

    From catalog/data/offerings.yaml (AWS DescribeInstanceTypeOfferings as moto ships it): an ASG
    whose type is not offered in its zone never launches a node. A region the file does not
    cover is not checked; `gpucluster doctor` asks the account itself.
    """
    if not zones:
        return
    _, as_of = catalog.offerings_source()
    for j, name in enumerate(g.instance_types):
        missing = {az: offered for az in zones if isinstance(az, str) and ZONE_NAME.fullmatch(az)
                   and (offered := catalog.offered_zones(name, az[:-1])) is not None and az not in offered}
        if not missing:
            continue
        region = next(iter(missing))[:-1]
        offered = catalog.offered_zones(name, region) or []
        where = (f"in {region} it is offered in {_zones_text(offered)}" if offered else
                 f"no {region} zone offers it; {_regions_text(region, catalog.offered_anywhere(name))} do")
        if j == 0:
            yield Finding(f"{path}.instance_types[0]", f"{name} is not offered in {', '.join(missing)}; "
                          f"{where} (offerings as of {as_of})")
        else:
            yield Finding(f"{path}.instance_types[{j}]", f"fallback {name} is not offered in "
                          f"{', '.join(missing)}, so the group never launches it there; {where}",
                          level="warning")



@group_check
def group_efa_spot(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """A multi-node EFA group that can hold spot nodes: one interruption stalls every rank (warning)."""
    cap = g.capacity
    if g.efa_enabled and g.max_nodes > 1 and cap.market == "mixed" and cap.spot_percent > 0 \
            and g.max_nodes > cap.on_demand_base:
        yield Finding(f"{path}.capacity.spot_percent",
                      f"a multi-node EFA group holds spot nodes ({_num(cap.spot_percent)} % above the "
                      "base): one reclaimed node stops the whole collective job, and its replacement "
                      "is not placed near the others; run multi-node EFA training on-demand or on a "
                      "Capacity Block, and single-node work on spot in a group of its own",
                      level="warning")



@group_check
def group_capacity(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    cap, cap_path = g.capacity, f"{path}.capacity"
    if cap.market == "capacity_block":
        if cap.capacity_reservation_id is None:
            yield Finding(f"{cap_path}.capacity_reservation_id",
                          "a capacity block needs its reservation id (cr-...)")
        if cap.spot_percent:
            yield Finding(f"{cap_path}.spot_percent",
                          f"capacity blocks have no spot share; must be 0, got {_num(cap.spot_percent)}")
        if len(g.instance_types) != 1:
            yield Finding(f"{path}.instance_types",
                          "a capacity block is for exactly one instance type, got "
                          f"{len(g.instance_types)}")
        for j, t in enumerate(g.types):
            if not t.family.capacity_blocks:
                yield Finding(f"{path}.instance_types[{j}]",
                              f"{t.name} cannot be bought as a Capacity Block for ML")
    elif not float(cap.spot_percent).is_integer():
        yield Finding(f"{cap_path}.spot_percent", "Auto Scaling splits on-demand and spot in whole "
                      f"percent; use a whole number, got {_num(cap.spot_percent)}")
    if cap.market != "capacity_block" and cap.duration_hours is not None:
        yield Finding(f"{cap_path}.duration_hours", "only used with market: capacity_block")
    elif cap.duration_hours is not None:
        yield from _block_duration(cap.duration_hours, f"{cap_path}.duration_hours")
    if cap.market == "mixed" and cap.capacity_reservation_id and cap.on_demand_base == 0 \
            and cap.spot_percent == 100:
        yield Finding(f"{cap_path}.capacity_reservation_id", "a capacity reservation serves "
                      "on-demand nodes, but on_demand_base is 0 and spot_percent is 100")
    if cap.capacity_reservation_id and zones is not None and len(zones) != 1:
        yield Finding(f"{path}.availability_zones", "a capacity reservation lives in "
                      "one availability zone; give the group exactly one (the reservation's)")
    if cap.base_commitment != "none" and cap.on_demand_base == 0:
        yield Finding(f"{cap_path}.base_commitment",
                      f"{cap.base_commitment} covers the on-demand base, but on_demand_base is 0")


def _block_duration(hours: int, path: str) -> Iterable[Finding]:
    """EC2 API reference, DescribeCapacityBlockOfferings CapacityDurationHours: whole days up to
    14 days, then whole weeks up to 182 days."""
    if hours % 24 or (hours > 14 * 24 and hours % (7 * 24)):
        yield Finding(path, "a Capacity Block lasts whole days up to 14 days (336 h), then whole weeks "
                      f"up to 182 days (4368 h), got {hours}")


# AWS ParallelCluster rejects a placement group with Capacity Blocks: their instances are already
# placed in an EC2 UltraCluster (ParallelCluster user guide, "Using Amazon EC2 Capacity Blocks for ML").
CAPACITY_BLOCK_PLACEMENT = ("a Capacity Block's instances are already placed together in an EC2 "
                            "UltraCluster; it takes no placement group (AWS ParallelCluster rejects one too)")


@group_check
def group_placement(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    if g.capacity.market == "capacity_block" and g.placement_group:
        yield Finding(f"{path}.placement_group", f"{CAPACITY_BLOCK_PLACEMENT}; remove placement_group")



@group_check
def group_ami(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    if g.ami_id and g.ami_ssm_parameter:
        yield Finding(f"{path}.ami_id", "set ami_id or ami_ssm_parameter, not both")




# Paths the bootstrap owns: a user file there would be overwritten, or would overwrite ours.
RESERVED_NODE_PATHS = ("/etc/gpucluster/", "/usr/local/sbin/gpucluster-", "/etc/systemd/system/gpucluster-",
                       "/opt/aws/amazon-cloudwatch-agent/", "/etc/profile.d/gpucluster-")
# EC2 user data is 16 KiB gzipped in all (EC2 user guide, "Run commands at launch"); the bootstrap
# and its scripts take about 11.5 KiB of it with the GPU health checks, the group's own files and
# setup may take this much (and `user_data_size` checks the whole, rendered).
NODE_SETUP_MAX_GZIP_BYTES = 4096
# Values known only at deploy time (generated bucket names, FSx names, the topic's ARN) are stood in
# for at their longest, but they are random where the stand-ins are not: what that costs gzip.
USER_DATA_MARGIN_BYTES = 128


class ProjectFileError(ValueError):
    """A `source` or `setup_script` file of the project cannot be read."""


def read_project_file(relative: str) -> str:
    """The text of a file of the user's project: relative to the directory holding Pulumi.yaml.

    Pulumi runs the program there; `gpucluster plan` finds it from the current directory up.
    """
    from pathlib import Path

    from gpucluster.project import find_project_root

    root = find_project_root() or Path.cwd()
    path = root / relative
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProjectFileError(f"no such file {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ProjectFileError(f"cannot read {path} as UTF-8 text ({err})") from None


@group_check
def group_node_setup(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """Setup and files: one source each, readable, not on the bootstrap's paths, within user data."""
    if g.setup and g.setup_script:
        yield Finding(f"{path}.setup_script", "set setup (commands) or setup_script (a file), not both")
    texts: list[str] = list(g.setup)
    if g.setup_script:
        try:
            texts.append(read_project_file(g.setup_script))
        except ProjectFileError as err:
            yield Finding(f"{path}.setup_script", str(err))
    seen: set[str] = set()
    for j, f in enumerate(g.files):
        where = f"{path}.files[{j}]"
        if (f.content is None) == (f.source is None):
            yield Finding(where, "set exactly one of content or source")
        if f.path in seen:
            yield Finding(f"{where}.path", f"{f.path} is written twice")
        seen.add(f.path)
        if f.path.startswith(RESERVED_NODE_PATHS) or f.path.rstrip("/") + "/" in RESERVED_NODE_PATHS:
            yield Finding(f"{where}.path", f"{f.path} is where gpucluster's own node files go; "
                          "choose another path (e.g. under /opt)")
        text = f.content
        if f.source is not None:
            try:
                text = read_project_file(f.source)
            except ProjectFileError as err:
                yield Finding(f"{where}.source", str(err))
        if text is not None:
            texts.append(text)
    import gzip

    size = len(gzip.compress("\n".join(texts).encode(), mtime=0))
    if size > NODE_SETUP_MAX_GZIP_BYTES:
        yield Finding(f"{path}.files", f"files and setup take {size} bytes gzipped; EC2 user data leaves "
                      f"them {NODE_SETUP_MAX_GZIP_BYTES}: keep large files in S3 and fetch them in setup")



def mig_instance_types() -> list[str]:
    """Families whose GPUs have MIG (catalog/data/mig_profiles.yaml), in catalog order."""
    return list(dict.fromkeys(catalog.family_of(n) for n in catalog.names() if catalog.mig_gpu(n)))


def _layout_text(layout: Sequence[str]) -> str:
    """['1g.10gb'] * 7 -> '7 x 1g.10gb'; a mixed layout -> its names, comma separated."""
    return f"{len(layout)} x {layout[0]}" if len(set(layout)) == 1 else ", ".join(layout)


def mig_layout_findings(gpu: catalog.MigGpu, instance_type: str, layout: Sequence[str],
                        path: str) -> Iterable[Finding]:
    """One GPU's layout against its profiles: known names, instance limits, slices and placements."""
    unknown = [n for n in dict.fromkeys(layout) if n not in gpu.profiles]
    if unknown:
        hint = difflib.get_close_matches(unknown[0], list(gpu.profiles), n=1, cutoff=0.6)
        tail = f"; did you mean {hint[0]}?" if hint else ""
        yield Finding(path, f"{unknown[0]} is not a MIG profile of {instance_type}'s {gpu.name} (it has "
                      f"{', '.join(gpu.profiles)}){tail}")
        return
    for name in dict.fromkeys(layout):
        most = gpu.profiles[name].max_instances
        if layout.count(name) > most:
            yield Finding(path, f"one {gpu.name} ({instance_type}) holds at most {most} x {name}, "
                          f"got {layout.count(name)}")
            return
    if gpu.place(layout) is not None:
        return
    compute = sum(gpu.profiles[n].compute_slices for n in layout)
    memory = sum(gpu.profiles[n].memory_slices for n in layout)
    if compute > gpu.compute_slices:
        why = f"they need {compute} of its {gpu.compute_slices} compute slices"
    elif memory > gpu.memory_slices:
        why = f"they need {memory} of its {gpu.memory_slices} memory slices"
    else:
        why = "no placement lets them sit side by side (3g and 4g instances start at slice 0 or 4 only)"
    yield Finding(path, f"{_layout_text(layout)} do not fit one {gpu.name} ({instance_type}): {why}")


@group_check
def group_mig(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    """A MIG layout names one profile (with a count) or a list, which every type's GPU can hold.

    From catalog/data/mig_profiles.yaml (NVIDIA's MIG user guide): GPUs without MIG (T4, A10G, L4,
    L40S) refuse any layout; the others take only their own profile names, at most their instance
    limit each, within 7 compute slices and on placements that do not overlap.
    """
    m, where = g.mig, f"{path}.mig"
    if m is None:
        return
    if (m.profile is None) == (m.profiles is None):
        yield Finding(where, "set profile (with an optional count) or profiles (a list per GPU)"
                      + (", not both" if m.profile else ""))
        return
    if m.count is not None and m.profile is None:
        yield Finding(f"{where}.count", "only used with profile (profiles lists every instance of a GPU)")
        return
    key = f"{where}.profile" if m.profile else f"{where}.profiles"
    fits: dict[str, int] = {}
    seen: set[str] = set()
    for j, t in enumerate(g.types):
        gpu = catalog.mig_gpu(t.name)
        if gpu is None:
            families = ", ".join(mig_instance_types())
            yield Finding(f"{path}.instance_types[{j}]", f"{t.name} has {t.gpu_model} GPUs, which have no "
                          f"MIG; a mig layout needs A100, H100, H200 or B200 ({families})")
            continue
        if m.profile is not None and m.profile in gpu.profiles:
            fits[t.name] = gpu.profiles[m.profile].max_instances
            if m.count is not None and m.count > fits[t.name]:
                yield Finding(f"{where}.count", f"one {gpu.name} ({t.name}) holds at most {fits[t.name]} x "
                              f"{m.profile}, got {m.count}")
                continue
        if gpu.name in seen:
            continue
        seen.add(gpu.name)
        layout = m.profiles or [m.profile] * (m.count or fits.get(t.name, 1))
        yield from mig_layout_findings(gpu, t.name, [str(n) for n in layout], key)
    if m.profile is not None and m.count is None and len(set(fits.values())) > 1:
        yield Finding(f"{where}.count", f"required here: the group's types fit different numbers of "
                      f"{m.profile} per GPU ({', '.join(f'{t}: {n}' for t, n in fits.items())})")



@check
def mig_idle_stop(spec: StackSpec) -> Iterable[Finding]:
    """The idle stop reads GPU utilisation, which a GPU in MIG mode does not report (warning)."""
    if not spec.autostop.enabled:
        return
    for i, g in enumerate(spec.node_groups):
        if g.mig is not None:
            yield Finding(f"node_groups[{i}].mig", "GPUs in MIG mode report no utilisation (NVML), so the "
                          "idle stop never sees this group idle (its alarm stays INSUFFICIENT_DATA and only "
                          "notifies); bound it with autostop.stop_schedule or max_lifetime_hours",
                          level="warning")


@check
def user_data_size(spec: StackSpec) -> Iterable[Finding]:
    """Each group's user data, rendered as its nodes get it, fits EC2's 16 KiB gzipped: what
    validates must deploy (the launch template's user data is rendered only during `pulumi up`)."""
    from gpucluster.node.userdata import MAX_USER_DATA_BYTES, gzipped_size, node_bootstrap
    from gpucluster.parts import DataMount

    mounts = [DataMount(
        name=d.name, access=d.access, bucket_name=d.bucket_name or longest_bucket_name(i), prefix=d.prefix,
        path=dataset_path(spec, d),
        fsx_dns_name=f"fs-{'0' * 17}.fsx.{spec.region}.amazonaws.com.cn" if d.access == "fsx" else None,
        fsx_mount_name="x" * 8 if d.access == "fsx" else None,
        expected_bucket_owner=d.expected_bucket_owner or "0" * 12) for i, d in enumerate(spec.datasets)]
    topic = f"arn:aws-us-gov:sns:{spec.region}:{'0' * 12}:{spec.cluster.name}-guardrails"
    limit = MAX_USER_DATA_BYTES - USER_DATA_MARGIN_BYTES
    for i, g in enumerate(spec.node_groups):
        if any(group_node_setup(g, None, "")):
            continue  # its files or setup are reported already (unreadable, ambiguous or too big alone)
        try:
            size = gzipped_size(node_bootstrap(spec, g, mounts, notify_topic_arn=topic))
        except ValueError:
            continue  # a value bash cannot hold: reported by its own check
        if size > limit:
            yield Finding(f"node_groups[{i}]", (
                f"node user data would be {size} bytes gzipped, over {limit} (EC2's {MAX_USER_DATA_BYTES} "
                "less room for deploy-time names): move files or setup to S3, or shorten hook commands"))


@group_check
def group_health(g: NodeGroupConfig, zones: Sequence[str] | None, path: str) -> Iterable[Finding]:
    h = g.health_checks
    if h.enabled and h.xid_window_minutes < h.interval_minutes:
        # A window shorter than the interval leaves minutes no check ever looks at.
        yield Finding(f"{path}.health_checks.xid_window_minutes",
                      f"must be at least interval_minutes ({h.interval_minutes}), or an XID between "
                      f"two checks is never seen; got {h.xid_window_minutes}")
    if h.enabled and g.mig is not None and h.dcgm_diag and "dcgm_diag" in h.model_fields_set:
        yield Finding(f"{path}.health_checks.dcgm_diag", "not run on a MIG group: DCGM's diagnostic on "
                      "GPUs in MIG mode is unverified here; the mig finding checks the layout instead",
                      level="warning")
    if h.enabled and g.mig is not None and g.launch_timeout_minutes < MIG_MIN_LAUNCH_TIMEOUT_MINUTES:
        yield Finding(f"{path}.health_checks.launch_timeout_minutes",
                      f"must be at least {MIG_MIN_LAUNCH_TIMEOUT_MINUTES} in a MIG group: a node's first "
                      "boot may reboot once to turn MIG mode on before its check can answer (default "
                      f"{MIG_LAUNCH_TIMEOUT_MINUTES}); got {g.launch_timeout_minutes}")


@check
def datasets(spec: StackSpec) -> Iterable[Finding]:
    names: set[str] = set()
    buckets: set[str] = set()
    for i, d in enumerate(spec.datasets):
        path = f"datasets[{i}]"
        if d.name in names:
            yield Finding(f"{path}.name", f"duplicate dataset name {d.name!r}")
        names.add(d.name)
        if d.bucket_name:
            if d.bucket_name in buckets:
                yield Finding(f"{path}.bucket_name", f"bucket {d.bucket_name!r} is used twice")
            buckets.add(d.bucket_name)
        yield from dataset_findings(d, spec.cluster.name, spec.node_group_zones, path)


def dataset_findings(d: DatasetConfig, cluster_name: str, node_group_zones: set[str] | None,
                     path: str = "dataset") -> Iterable[Finding]:
    """Every rule on one dataset alone; `node_group_zones` None where the node groups are not known."""
    if d.existing and not d.bucket_name:
        yield Finding(f"{path}.bucket_name", "required for an existing bucket")
    if not d.existing and not d.bucket_name:
        generated = generated_bucket_prefix(cluster_name, d.name)
        if generated.startswith(BUCKET_RESERVED_PREFIXES):
            yield Finding(f"{path}.bucket_name", f"the generated bucket name would start with "
                          f"{generated!r}, a prefix S3 reserves; set a bucket_name")
    if d.access == "fsx" and d.fsx is None:
        yield Finding(f"{path}.fsx", "required when access is fsx")
    if d.fsx is not None:
        if d.access != "fsx":
            yield Finding(f"{path}.fsx", f"only used with access: fsx, got access: {d.access}")
        yield from _fsx_rules(d, node_group_zones, path)
    if d.mount_path and d.access != "mount":
        yield Finding(f"{path}.mount_path", f"only used with access: mount, got {d.access}")
    if d.expected_bucket_owner and not d.existing:
        yield Finding(f"{path}.expected_bucket_owner", "only used with existing: true (a bucket the "
                      "stack creates belongs to the deploying account)")
    yield from _checkpoint_rules(d, path)


def _checkpoint_rules(d: DatasetConfig, path: str) -> Iterable[Finding]:
    if d.checkpoint_prefix == "":
        yield Finding(f"{path}.checkpoint_prefix", "must be a folder-like prefix such as "
                      "'checkpoints/', not the whole bucket (nodes get write access to it)")
    elif d.checkpoint_prefix is not None and d.prefix and (
            d.checkpoint_prefix.startswith(d.prefix) or d.prefix.startswith(d.checkpoint_prefix)):
        yield Finding(f"{path}.checkpoint_prefix", "must not overlap the read-only data "
                      f"prefix {d.prefix!r}, got {d.checkpoint_prefix!r}")
    for key in ("noncurrent_version_expiration_days", "newer_noncurrent_versions"):
        if key not in d.model_fields_set:
            continue
        if d.existing:
            yield Finding(f"{path}.{key}", "only applies to buckets this stack creates; an existing "
                          "bucket's lifecycle is never changed")
        elif d.checkpoint_prefix is None:
            yield Finding(f"{path}.{key}",
                          "only used with a checkpoint_prefix (the lifecycle rule covers it alone)")


def _fsx_rules(d: DatasetConfig, node_group_zones: set[str] | None, dataset: str) -> Iterable[Finding]:
    fsx, path = d.fsx, f"{dataset}.fsx"
    if fsx is None:
        return
    size = fsx.storage_capacity_gib
    # FSx API reference, CreateFileSystem StorageCapacity: SCRATCH_2 and PERSISTENT_2 (SSD)
    # take 1200 GiB, 2400 GiB and increments of 2400 GiB.
    if size != 1200 and size % 2400:
        yield Finding(f"{path}.storage_capacity_gib",
                      f"FSx for Lustre takes 1200 or a multiple of 2400 GiB, got {size}")
    if fsx.deployment_type == "PERSISTENT_2" and fsx.throughput_per_unit_mib is None:
        yield Finding(f"{path}.throughput_per_unit_mib",
                      "required for PERSISTENT_2 (125, 250, 500 or 1000)")
    if fsx.deployment_type == "SCRATCH_2" and fsx.throughput_per_unit_mib is not None:
        yield Finding(f"{path}.throughput_per_unit_mib",
                      "SCRATCH_2 has a fixed throughput; only PERSISTENT_2 takes this")
    if fsx.deployment_type == "SCRATCH_2" and "automatic_backup_retention_days" in fsx.model_fields_set:
        yield Finding(f"{path}.automatic_backup_retention_days",
                      "SCRATCH_2 file systems have no backups; only PERSISTENT_2 takes this")
    if fsx.deployment_type == "PERSISTENT_2" and fsx.automatic_backup_retention_days == 0:
        yield Finding(f"{path}.automatic_backup_retention_days",
                      "a PERSISTENT_2 file system keeps automatic backups: 1-90 days, got 0")
    if fsx.availability_zone and node_group_zones is not None \
            and fsx.availability_zone not in node_group_zones:
        yield Finding(f"{path}.availability_zone", f"no node group runs in "
                      f"{fsx.availability_zone!r} (node groups use "
                      f"{', '.join(sorted(node_group_zones))})")
    if not fsx.client_key_fingerprints:
        yield Finding(f"{path}.client_key_fingerprints",
                      "not set: where the AMI lacks the Lustre client, nodes trust the apt key AWS serves "
                      "over TLS unchecked; pin it (README: Datasets, Lustre client key)", level="warning")
    if d.checkpoint_prefix and not d.prefix:
        # The data association would link the whole bucket, checkpoints included: what the
        # checkpoint association exports would come back as a second copy under /data.
        yield Finding(f"{dataset}.prefix",
                      "an FSx dataset with a checkpoint_prefix needs a data prefix of its own "
                      "(e.g. 'data/'), so the two data repository associations do not overlap")


@check
def node_role_size(spec: StackSpec) -> Iterable[Finding]:
    """Each group's node role's inline policies fit IAM's limit with every dataset and the group's
    health policy, at their longest names: what validates must deploy (a bigger policy fails
    `pulumi up` half-way)."""
    grants = [g for i, d in enumerate(spec.datasets)
              for g in dataset_grants(d.bucket_name or longest_bucket_name(i), d.prefix, d.checkpoint_prefix,
                                      d.expected_bucket_owner)]
    health = [[longest_health_policy(identity=spec.identity, cluster_name=spec.cluster.name, group=g.name,
                                     region=spec.region, replace=g.health_checks.on_failure == "replace")]
              if g.health_checks.enabled else [] for g in spec.node_groups]
    images = [g.container_image for g in spec.node_groups if g.container_image]
    chars = max(node_inline_policies_chars(spec.cluster.name, grants, more,
                                           run_log_group=run_log_group_name(spec.identity), images=images)
                for more in health)
    if chars > ROLE_INLINE_POLICIES_MAX_CHARS:
        yield Finding("datasets", f"the node role's policies for {len(spec.datasets)} dataset(s) would "
                      f"reach {chars} characters; IAM allows {ROLE_INLINE_POLICIES_MAX_CHARS} per role: use "
                      "fewer datasets, shorter prefixes, or short bucket names (bucket_name)")


@check
def dataset_paths(spec: StackSpec) -> Iterable[Finding]:
    """Where datasets appear on a node: one place each, never inside the NVMe scratch mount."""
    scratch = {g.scratch_mount.rstrip("/") for g in spec.node_groups}
    seen: dict[str, str] = {}
    for i, d in enumerate(spec.datasets):
        key = {"mount": "mount_path", "fsx": "fsx.mount_path"}.get(d.access)
        if key is None:
            if len(scratch) > 1:
                yield Finding(f"datasets[{i}].access", "copy_to_scratch needs one scratch_mount "
                              f"for every node group, got {', '.join(sorted(scratch))}")
            continue
        where = dataset_path(spec, d)
        yield from data_path_findings(where, f"datasets[{i}].{key}", scratch, seen)
        seen[d.name] = where


def data_path_findings(where: str, path: str, scratch_mounts: Iterable[str],
                       others: Mapping[str, str]) -> Iterable[Finding]:
    """A dataset's place on the node overlaps neither NVMe scratch nor another dataset (name -> path)."""
    for mount in sorted(scratch_mounts):
        if _nested(where, mount):
            yield Finding(path, f"{where} overlaps the NVMe scratch mount "
                          f"{mount}, which is erased and reformatted at boot")
    for other, other_path in others.items():
        if _nested(where, other_path):
            yield Finding(path, f"{where} overlaps {other_path} of dataset {other!r}")


def _nested(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def dataset_path(spec: StackSpec, d: DatasetConfig) -> str:
    """Where a dataset appears on every node (copy: under scratch; mount; FSx mount path)."""
    if d.access == "fsx" and d.fsx is not None:
        return d.fsx.mount_path
    if d.access == "mount":
        return d.mount_path or f"/data/{d.name}"
    return f"{spec.node_groups[0].scratch_mount.rstrip('/')}/{d.name}"


@check
def resource_names(spec: StackSpec) -> Iterable[Finding]:
    """Every physical name the program gives (Pulumi's auto-names included) fits AWS's limit for it."""
    from gpucluster.names import name_findings  # it reads specs: imported here, after this module

    yield from name_findings(spec)


@check
def budget_rules(spec: StackSpec) -> Iterable[Finding]:
    if spec.budget is not None:
        yield from budget_findings(spec.budget)


def budget_findings(b: BudgetConfig, path: str = "budget") -> Iterable[Finding]:
    t = b.alert_thresholds_percent
    if any(later <= earlier for earlier, later in pairwise(t)):
        yield Finding(f"{path}.alert_thresholds_percent",
                      f"must be strictly ascending, got {', '.join(_num(x) for x in t)}")
    # One ACTUAL notification per distinct threshold plus the FORECASTED one at 100 %;
    # a budget holds at most 10 notifications (Budgets API reference, "Notification").
    actual = set(t) | ({b.action_threshold_percent} if b.action_threshold_percent else set())
    if len(actual) + 1 > MAX_BUDGET_NOTIFICATIONS:
        yield Finding(f"{path}.alert_thresholds_percent",
                      f"AWS Budgets allows {MAX_BUDGET_NOTIFICATIONS} notifications per budget: "
                      f"{len(actual)} actual-spend thresholds (with action_threshold_percent) and the "
                      f"forecast alert make {len(actual) + 1}")


@check
def autostop_rules(spec: StackSpec) -> Iterable[Finding]:
    yield from autostop_findings(spec.autostop)


def autostop_findings(a: AutoStopConfig, path: str = "autostop") -> Iterable[Finding]:
    if a.start_schedule and not a.stop_schedule:
        yield Finding(f"{path}.start_schedule", "needs a stop_schedule to undo")
    if a.start_schedule and a.start_schedule == a.stop_schedule:
        yield Finding(f"{path}.start_schedule", "is the same as stop_schedule")


# ----------------------------------------------------------------------- parsing


def _describe(model: type[BaseModel] | None, loc: tuple[str | int, ...]) -> list[str]:
    """Field names of the model found at `loc` inside `model`, for did-you-mean hints."""
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        if field is None:
            return []
        model = model_in(field.annotation)
    return list(model.model_fields) if model else []


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (`X`, `X | None`, `list[X]`, `Annotated[X, ...]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = model_in(arg)
        if found:
            return found
    return None


def format_path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: Mapping[str, Any], root: type[BaseModel], loc: tuple[str | int, ...]) -> str:
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    if kind == "extra_forbidden":
        known = _describe(root, loc[:-1])
        hint = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
        tail = f"did you mean {hint[0]!r}?" if hint else f"known keys: {', '.join(known)}"
        return f"unknown key; {tail}"
    if kind == "missing":
        return "required key is missing"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {shown(value)}"
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return f"must be a whole number, got {shown(value)}"
    if kind in ("float_parsing", "float_type"):
        return f"must be a number, got {shown(value)}"
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false, got {shown(value)}"
    if kind == "string_type":
        return f"must be a string, got {shown(value)}"
    if kind == "list_type":
        return f"must be a list, got {type(value).__name__}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping of keys, got {type(value).__name__}"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s), got {ctx.get('actual_length')}"
    if kind == "too_long":
        return f"allows at most {ctx.get('max_length')} item(s), got {ctx.get('actual_length')}"
    return str(error["msg"])


def _findings_from(exc: ValidationError, root: type[BaseModel],
                   prefix: tuple[str | int, ...] = ()) -> list[Finding]:
    findings = []
    for error in exc.errors():
        # a dict key's own error carries a trailing "[key]" marker after the key
        loc = tuple(p for p in error["loc"] if p != "[key]")
        findings.append(Finding(format_path(prefix + loc), _message(error, root, loc)))
    return findings


def validation_findings(exc: ValidationError, root: type[BaseModel] | None = None,
                        prefix: tuple[str | int, ...] = ()) -> list[Finding]:
    """A pydantic error as findings worded like the stack file's (component Args are checked with it)."""
    return _findings_from(exc, root, prefix)  # type: ignore[arg-type]


class _JsonRefused(Exception):
    """JSON text that parses but is not a bounded plain value (see `_decode`)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise _JsonRefused(f"duplicate key {shown(key)} in a mapping")
        seen[key] = value
    return seen


def _number(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def bounded(text: str) -> Any:
        if len(text) > MAX_NUMBER_CHARS:
            raise _JsonRefused(f"a number of {len(text)} characters; at most {MAX_NUMBER_CHARS}")
        return parse(text)

    return bounded


def _decode(value: Any) -> tuple[Any, str | None]:
    """(value, problem): Pulumi hands structured config over as JSON text; YAML gives objects.

    Under `pulumi up` every value arrives as a string in PULUMI_CONFIG, so the JSON of a
    mapping or list is parsed here with the stack file's bounds: no duplicate keys, no
    endless numbers, no unbounded nesting. Text that is not JSON stays the string it is.
    """
    if not isinstance(value, str) or value[:1] not in ("[", "{") or len(value) > MAX_INPUT_BYTES:
        return value, None
    try:
        return json.loads(value, object_pairs_hook=_unique_keys, parse_int=_number(int),
                          parse_float=_number(float)), None
    except _JsonRefused as refused:
        return value, str(refused)
    except RecursionError:
        return value, f"nested more than {MAX_NESTING} deep"
    except ValueError:
        return value, None


def plain_value_problem(value: Any) -> tuple[tuple[str | int, ...], str] | None:
    """(where inside `value`, problem) for the first part that is not a bounded plain value.

    Plain: mappings with string keys, lists, strings (UTF-8, no NUL), whole numbers of at
    most MAX_NUMBER_CHARS digits, finite or not floats, booleans and null; nested at most
    MAX_NESTING deep and MAX_VALUES values in all. Iterative, so hostile objects (cycles,
    deep nesting) end in a finding, never in a RecursionError.
    """
    count = 0
    pending: list[tuple[Any, int, tuple[str | int, ...]]] = [(value, 0, ())]
    while pending:
        item, depth, loc = pending.pop()
        count += 1
        if count > MAX_VALUES:
            return loc, f"more than {MAX_VALUES} values (YAML aliases count expanded)"
        if depth > MAX_NESTING:
            return loc, f"nested more than {MAX_NESTING} deep"
        if isinstance(item, dict):
            for key in reversed(list(item)[:MAX_VALUES]):
                if not isinstance(key, str):
                    return loc, f"mapping keys must be strings, got {shown(key)}"
                pending.append((item[key], depth + 1, (*loc, key)))
        elif isinstance(item, list | tuple):
            pending.extend((v, depth + 1, (*loc, i)) for i, v in reversed(list(enumerate(item[:MAX_VALUES]))))
        elif isinstance(item, str):
            problem = _text_problem(item)
            if problem:
                return loc, problem
        elif isinstance(item, bool | float) or item is None:
            continue
        elif isinstance(item, int):
            if item.bit_length() > MAX_NUMBER_CHARS * 3.33:
                return loc, f"a number of more than {MAX_NUMBER_CHARS} digits"
        else:
            return loc, (f"must be a string, number, boolean, list or mapping, got "
                                      f"{type(item).__name__}")
    return None


def _text_problem(text: str) -> str | None:
    if len(text) > MAX_INPUT_BYTES:
        return f"a string of {len(text)} characters; at most {MAX_INPUT_BYTES}"
    if "\0" in text:
        return "NUL characters cannot reach a node or a Lambda environment"
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            return "not valid Unicode text (a lone surrogate escape such as \\ud800)"
    return None


def parse_stack_config(config: Mapping[str, Any], stack: str, *, project: str = PROJECT,
                       organization: str | None = None) -> StackSpec:
    """Validate a stack's config map (`project:key` -> value) into a StackSpec.

    `project` is the Pulumi project's name (Pulumi.yaml `name`). `organization` is the Pulumi
    organization the stack is being deployed in, known under `pulumi up` only; the stack file's
    `gpucluster:organization` must then agree with it, or be absent in a self-managed backend, so
    that the CLI, which reads only the stack file, computes the deployment's identity exactly.
    Raises SpecError with every problem found: unknown or missing keys, bad values and all
    cross-field rules.
    """
    findings: list[Finding] = []
    values: dict[str, Any] = {}
    known = list(StackConfig.model_fields)
    unset = object()
    organization_key: Any = unset
    for key, raw in config.items():
        if not isinstance(key, str):
            findings.append(Finding(shown(key), "config keys must be strings (namespace:key)"))
            continue
        namespace, _, name = key.rpartition(":")
        ours = namespace in ("", PROJECT)
        # Every value is bounded, also those of namespaces the program ignores (aws:*):
        # they all travel to the engine as JSON.
        value, problem = _decode(raw)
        where = ((), problem) if problem else plain_value_problem(value)
        if where is not None:
            findings.append(Finding(format_path((name if ours else key, *where[0])), where[1]))
            continue
        if not ours:
            continue
        if key in (ORGANIZATION_KEY, "organization"):
            organization_key = value
            continue
        if name not in known:
            hint = difflib.get_close_matches(name, [*known, "organization"], n=1, cutoff=0.6)
            tail = f"did you mean '{PROJECT}:{hint[0]}'?" if hint else f"known: {', '.join(known)}"
            findings.append(Finding(f"{PROJECT}:{name}", f"unknown key; {tail}"))
            continue
        values[name] = value
    if organization_key is not unset:
        values["organization"] = organization_key
        findings.extend(_organization_findings(organization_key, organization))
    elif organization is not None:
        values["organization"] = organization
        findings.extend(_organization_findings(None, organization))
    region = config.get(REGION_KEY)
    if region is None:
        findings.append(Finding(REGION_KEY, "required key is missing (e.g. us-east-1)"))
    elif any(f.path.startswith(REGION_KEY) for f in findings):
        region = None  # reported above; validate the rest with a stand-in
    try:
        spec = StackSpec.model_validate({**values, "stack": stack, "project": project,
                                         "region": "us-east-1" if region is None else region})
    except ValidationError as exc:
        renamed = {"region": REGION_KEY, "organization": ORGANIZATION_KEY,
                   "project": "project (Pulumi.yaml name)"}
        for finding in _findings_from(exc, StackSpec):
            findings.append(Finding(renamed.get(finding.path, finding.path), finding.message))
        raise SpecError(findings) from None
    for rule in CHECKS:
        findings.extend(f for f in rule(spec) if f.level == "error")
    if findings:
        raise SpecError(findings)
    return spec


def _organization_findings(configured: Any, deployed: str | None) -> Iterable[Finding]:
    """The stack file's organization against the one `pulumi up` deploys in (None: not deploying)."""
    if deployed is None or configured == deployed:
        return
    if configured is None and deployed != DIY_ORGANIZATION:
        yield Finding(ORGANIZATION_KEY, f"deploying in Pulumi organization {deployed!r}: add "
                      f"`{ORGANIZATION_KEY}: {deployed}` to the stack file (status, resume and doctor "
                      "compute the gpucluster:stack identity from it)")
    elif configured is not None:
        yield Finding(ORGANIZATION_KEY, f"is {configured!r}, but this stack deploys in Pulumi "
                      f"organization {deployed!r}; set it to {deployed!r}")


def stack_warnings(spec: StackSpec) -> list[Finding]:
    """The warning-level findings of every check on a valid spec (what `plan` prints)."""
    return [f for rule in CHECKS for f in rule(spec) if f.level == "warning"]
