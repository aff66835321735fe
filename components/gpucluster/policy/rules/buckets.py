"""Data-protection rules for S3: encrypted, private, TLS only, surviving a destroy, old versions kept.

Owns the five `s3-*` rules and how a bucket's separate configuration
resources (encryption, public access block, policy, ACL, versioning,
lifecycle) are found for it. Pure: reads resource records only, never Pulumi or AWS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpucluster.policy.records import UNKNOWN, Resource, Stack, dig, items, number, true_or_unknown, truthy
from gpucluster.policy.rules.iam import has_wildcard, statements_of
from gpucluster.policy.rules.registry import rule
from gpucluster.policy.rules.tokens import (
    BUCKET_ACL,
    BUCKET_LIFECYCLE,
    BUCKET_PAB,
    BUCKET_POLICY,
    BUCKET_SSE,
    BUCKET_VERSIONING,
    BUCKETS,
)

# S3 API, ServerSideEncryptionByDefault.SSEAlgorithm: the values S3 accepts.
SSE_ALGORITHMS = ("aws:kms", "aws:kms:dsse", "AES256")
# S3 user guide, "Canned ACL": the ones that grant access outside the account.
PUBLIC_ACLS = ("public-read", "public-read-write", "authenticated-read")


def _bucket_parts(stack: Stack, bucket: Resource, types: Sequence[str]) -> tuple[list[Resource], bool]:
    """The resources of `types` configuring `bucket`, and whether some could not be placed."""
    mine, unsure = [], False
    for part in stack.of_type(*types):
        target = stack.resolve(part, "bucket", part.props.get("bucket"), BUCKETS)
        if target is bucket:
            mine.append(part)
        elif target is UNKNOWN or target is None:
            unsure = True
    return mine, unsure


@rule("s3-encryption",
      "S3 buckets have default encryption (SSE-KMS, DSSE-KMS or SSE-S3) configured.",
      "stack")
def s3_encryption(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for bucket in stack.of_type(*BUCKETS):
        inline = dig(bucket.props, "serverSideEncryptionConfiguration", "rule",
                     "applyServerSideEncryptionByDefault", "sseAlgorithm")
        if inline in SSE_ALGORITHMS or inline is UNKNOWN:
            continue
        parts, unsure = _bucket_parts(stack, bucket, BUCKET_SSE)
        algorithms = [dig(r, "applyServerSideEncryptionByDefault", "sseAlgorithm")
                      for p in parts for r in (items(p.props.get("rules")) or [])]
        if any(a in SSE_ALGORITHMS or a is UNKNOWN for a in algorithms) or (unsure and not parts):
            continue
        yield bucket, ("no default encryption: add a BucketServerSideEncryptionConfiguration "
                       f"with sseAlgorithm one of {', '.join(SSE_ALGORITHMS)}")


@rule("s3-public-access-blocked",
      "S3 buckets block all public access (all four public-access-block settings), and no bucket "
      "policy or ACL makes them public.",
      "stack")
def s3_public_access_blocked(stack: Stack,
                             config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    settings = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
    for bucket in stack.of_type(*BUCKETS):
        blocks, unsure = _bucket_parts(stack, bucket, BUCKET_PAB)
        if blocks:
            off = [s for s in settings if not any(true_or_unknown(b.props.get(s)) for b in blocks)]
            if off:
                yield bucket, f"public access block leaves {', '.join(off)} off"
        elif not unsure:
            yield bucket, "no BucketPublicAccessBlock (all four settings true)"
        acls = [bucket.props.get("acl")] + [a.props.get("acl") for a in _bucket_parts(stack, bucket,
                                                                                          BUCKET_ACL)[0]]
        for acl in acls:
            if acl in PUBLIC_ACLS:
                yield bucket, f"ACL {acl!r} makes the bucket public"
        for policy in _bucket_policies(stack, bucket):
            for i, s in enumerate(policy):
                if s.get("Effect") == "Allow" and _public_principal(s.get("Principal")) and not s.get(
                        "Condition"):
                    yield bucket, f"bucket policy Statement[{i}] allows everyone (Principal '*')"


def _bucket_policies(stack: Stack, bucket: Resource) -> list[list[Mapping[str, Any]]]:
    """Known statement lists of the bucket's own `policy` input and its BucketPolicy resources."""
    documents = [bucket.props.get("policy")] + [p.props.get("policy")
                                                for p in _bucket_parts(stack, bucket, BUCKET_POLICY)[0]]
    found = []
    for document in documents:
        statements = statements_of(document) if document is not None else []
        if statements is not UNKNOWN and statements:
            found.append(statements)
    return found


def _public_principal(principal: Any) -> bool:
    if principal == "*":
        return True
    return isinstance(principal, Mapping) and has_wildcard(principal.get("AWS"), "*")


@rule("s3-tls-only",
      "S3 bucket policies deny every request not made over TLS (aws:SecureTransport = false).",
      "stack")
def s3_tls_only(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for bucket in stack.of_type(*BUCKETS):
        parts, unsure = _bucket_parts(stack, bucket, BUCKET_POLICY)
        policy = bucket.props.get("policy")
        if policy is UNKNOWN or any(p.props.get("policy") is UNKNOWN for p in parts):
            continue
        if any(_denies_plain_http(s) for statements in _bucket_policies(stack, bucket) for s in statements):
            continue
        if unsure and not parts:
            continue
        yield bucket, ("no bucket policy statement denies requests without TLS (Effect Deny, "
                       "Condition Bool aws:SecureTransport false)")


def _denies_plain_http(statement: Mapping[str, Any]) -> bool:
    # S3 user guide, "Enforce encryption in transit": Deny s3:* when aws:SecureTransport is false.
    if statement.get("Effect") != "Deny" or not has_wildcard(statement.get("Action"), "s3:*", "*"):
        return False
    secure = dig(statement, "Condition", "Bool", "aws:SecureTransport")
    return any(str(v).lower() == "false" for v in (items(secure) or []))


@rule("s3-data-buckets-protected",
      "Data buckets survive a `pulumi destroy`: protected (or retained on delete), no forceDestroy, "
      "versioning on.",
      "stack")
def s3_data_buckets_protected(stack: Stack,
                              config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    for bucket in stack.of_type(*BUCKETS):
        if not (bucket.protect or bucket.retain_on_delete):
            yield bucket, "not protected: set protect=True (and retain_on_delete=True) on the bucket"
        if truthy(bucket.props.get("forceDestroy")):
            yield bucket, "forceDestroy is true: a delete would empty the bucket first"
        inline = dig(bucket.props, "versioning", "enabled")
        if truthy(inline) or inline is UNKNOWN:
            continue
        parts, unsure = _bucket_parts(stack, bucket, BUCKET_VERSIONING)
        statuses = [dig(p.props, "versioningConfiguration", "status") for p in parts]
        if any(s in ("Enabled", UNKNOWN) for s in statuses) or (unsure and not parts):
            continue
        yield bucket, "versioning is not enabled (a BucketVersioning with status Enabled)"


@rule("s3-lifecycle-keeps-data",
      "S3 lifecycle rules never expire current objects, and expire old versions no sooner than "
      "min_noncurrent_days and no later than max_noncurrent_days (config).",
      "stack",
      schema={"min_noncurrent_days": {"type": "integer", "minimum": 1,
                                      "description": "Old versions stay at least this long (to restore)."},
              "max_noncurrent_days": {"type": "integer", "minimum": 1,
                                      "description": "Old versions go after this at the latest (cost)."}},
      defaults={"min_noncurrent_days": 1, "max_noncurrent_days": 3650})
def s3_lifecycle_keeps_data(stack: Stack, config: Mapping[str, Any]) -> Iterable[tuple[Resource | None, str]]:
    """Versioning keeps what is overwritten or deleted; a lifecycle rule is the one way left to lose it
    without deleting a version (S3 user guide, "Lifecycle configuration elements": an expiration on a
    versioned bucket turns current objects into old versions, which noncurrent expiry then removes).
    The defaults are the stack file's bounds (datasets[].noncurrent_version_expiration_days)."""
    low, high = config["min_noncurrent_days"], config["max_noncurrent_days"]
    found: list[tuple[Resource, Any, str]] = []
    for lifecycle in stack.of_type(*BUCKET_LIFECYCLE):
        rules = items(lifecycle.props.get("rules"))
        for i, r in enumerate(rules if rules is not UNKNOWN else []):
            if isinstance(r, Mapping) and r.get("status") != "Disabled":
                found.append((lifecycle, r, f"rule {r.get('id') or i!r}"))
    for bucket in stack.of_type(*BUCKETS):  # the deprecated inline form
        rules = items(bucket.props.get("lifecycleRules"))
        for i, r in enumerate(rules if rules is not UNKNOWN else []):
            if isinstance(r, Mapping) and r.get("enabled") is not False:
                inline = {**r, "noncurrentVersionExpiration": {
                    "noncurrentDays": dig(r, "noncurrentVersionExpiration", "days")}}
                found.append((bucket, inline, f"lifecycleRules[{i}]"))
    for resource, r, where in found:
        expiration = r.get("expiration")
        if isinstance(expiration, Mapping) and any(expiration.get(k) not in (None, 0, "")
                                                   for k in ("days", "date")):
            yield resource, f"{where} expires current objects: only old versions may expire"
        days = dig(r, "noncurrentVersionExpiration", "noncurrentDays")
        if days is not None and days is not UNKNOWN and not low <= number(days, low) <= high:
            yield resource, (f"{where} expires old versions after {number(days, low):g} days, outside "
                             f"{low}..{high} (min_noncurrent_days, max_noncurrent_days)")
