"""Data deletion needs more than a deploy role (issue 12, item 4): the created dataset buckets' policy
denies deleting object versions and the bucket to all but the break-glass role, while everything
Pulumi manages on the bucket stays deployable; and a dataset's expected owner is validated."""

from __future__ import annotations

import json
from typing import Any

import pytest

from base_config import base, plan_config
from gpucluster.aws.datasets import DATA_DELETION, bucket_policy
from gpucluster.plan import Plan
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import SpecError
from iam_eval import allowed
from shipped import shipped_plan

ACCOUNT = "123456789012"
BREAK_GLASS = f"arn:aws:iam::{ACCOUNT}:role/acme-break-glass"
DEPLOY = f"arn:aws:iam::{ACCOUNT}:role/gpucluster-deploy-prod"
ADMIN = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
PULUMI_MANAGES = ["s3:PutLifecycleConfiguration", "s3:PutBucketVersioning", "s3:PutBucketPolicy",
                  "s3:PutEncryptionConfiguration", "s3:PutBucketPublicAccessBlock",
                  "s3:PutBucketOwnershipControls", "s3:PutBucketTagging", "s3:GetObject", "s3:PutObject",
                  "s3:DeleteObject"]


def bucket_policies(plan: Plan) -> list[dict[str, Any]]:
    """The dataset buckets' policies (the node-scripts bucket's are tests/test_node_scripts.py's)."""
    return [json.loads(p.inputs["policy"]) for p in plan.of_type("aws:s3/bucketPolicy:BucketPolicy")
            if "-node-scripts-" not in p.name]


@pytest.fixture(scope="module")
def prod() -> Plan:
    return shipped_plan("prod")


def test_the_shipped_bucket_denies_deleting_data_to_all_but_the_break_glass_role(prod: Plan) -> None:
    [policy] = bucket_policies(prod)
    corpus = prod.outputs["datasets"]["pretrain-corpus"]["bucket_arn"]
    deny = policy["Statement"][1]
    assert deny == {"Sid": "DataDeletionNeedsBreakGlass", "Effect": "Deny", "Principal": "*",
                    "Action": ["s3:DeleteObjectVersion", "s3:DeleteBucket"],
                    "Resource": [corpus, f"{corpus}/*"],
                    "Condition": {"ArnNotEquals": {"aws:PrincipalArn": BREAK_GLASS}}}
    # an administrator's own policies do not matter: the bucket's deny wins, but for break-glass
    for principal, expected in ((DEPLOY, False), (f"arn:aws:iam::{ACCOUNT}:user/admin", False),
                                (BREAK_GLASS, True)):
        context = {"aws:PrincipalArn": principal}
        assert allowed([ADMIN, policy], None, "s3:DeleteObjectVersion", f"{corpus}/corpus/v3/x",
                       **context) is expected
        assert allowed([ADMIN, policy], None, "s3:DeleteBucket", corpus, **context) is expected
    # what Pulumi and the nodes do stays allowed (a plain delete only adds a delete marker)
    for action in PULUMI_MANAGES:
        assert allowed([ADMIN, policy], None, action, f"{corpus}/x", **{"aws:PrincipalArn": DEPLOY,
                                                                         "aws:SecureTransport": "true"})


def test_the_break_glass_role_matches_infra_bootstrap_state(prod: Plan) -> None:
    """The same actions, the same role ARN as the boundaries the bootstrap script makes."""
    from test_bootstrap_state import bootstrap_state as module
    assert set(DATA_DELETION) == {a for a in module.DATA_DELETION if a.startswith("s3:")}
    boundary = module.data_deletion_deny("aws", "acme-break-glass", ACCOUNT)
    [policy] = bucket_policies(prod)
    assert policy["Statement"][1]["Condition"] == boundary["Condition"]


def test_without_a_break_glass_role_nobody_deletes_versions_or_the_bucket() -> None:
    config = base()
    config["gpucluster:datasets"] = [{"name": "data", "prefix": "d/"}]
    [policy] = bucket_policies(plan_config(config))
    deny = policy["Statement"][1]
    assert deny["Action"] == DATA_DELETION and "Condition" not in deny
    arn = deny["Resource"][0]
    assert not allowed([ADMIN, policy], None, "s3:DeleteBucket", arn, **{"aws:PrincipalArn": BREAK_GLASS})
    assert allowed([ADMIN, policy], None, "s3:PutLifecycleConfiguration", arn)


def test_the_tls_statement_stays_first_and_whole() -> None:
    policy = json.loads(bucket_policy("arn:aws:s3:::b", BREAK_GLASS))
    assert policy["Statement"][0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert [s["Sid"] for s in policy["Statement"]] == ["DenyInsecureTransport", "DataDeletionNeedsBreakGlass"]


def test_existing_buckets_get_no_policy_from_the_stack(prod: Plan) -> None:
    """An existing bucket is never reconfigured: its owner protects it; the nodes only read it."""
    assert len(bucket_policies(prod)) == 1  # the created corpus bucket only, not acme-ml-eval-sets


@pytest.mark.parametrize(("dataset", "message"), [
    ({"name": "data", "prefix": "x/", "expected_bucket_owner": "123456789012"},
     "datasets[0].expected_bucket_owner: only used with existing: true"),
    ({"name": "data", "bucket_name": "team-data", "existing": True, "expected_bucket_owner": "12345"},
     "datasets[0].expected_bucket_owner: must be a 12-digit AWS account id"),
])
def test_expected_bucket_owner_is_checked(dataset: dict[str, Any], message: str) -> None:
    config = base()
    config["gpucluster:datasets"] = [dataset]
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize("value", ["arn:aws:iam::1:role/x", "a b", "x" * 65])
def test_a_bad_break_glass_role_is_one_line_naming_the_key(value: str) -> None:
    config = base()
    config["gpucluster:cluster"]["break_glass_role"] = value
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    [line] = str(err.value).splitlines()
    assert line.startswith("cluster.break_glass_role: must be an IAM role name"), line
