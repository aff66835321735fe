"""infra/bootstrap-state: the state bucket, KMS key and GitHub OIDC roles, made against moto."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "infra" / "bootstrap-state" / "bootstrap_state.py"
ACCOUNT = "123456789012"
# moto knows AWS managed policies (ReadOnlyAccess, PowerUserAccess) only when asked to load them
MANAGED = {"iam": {"load_aws_managed_policies": True}}


def _module() -> Any:
    spec = importlib.util.spec_from_file_location("bootstrap_state", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


bootstrap_state = _module()


def run(session: Any) -> Any:
    return bootstrap_state.bootstrap(session, "acme-gpucluster-state", "us-west-2", "acme/gpucluster",
                                     ["dev", "prod"])


@pytest.fixture(scope="module")
def made() -> Any:
    """One fake account, bootstrapped once (loading moto's managed policies takes most of a second)."""
    with mock_aws(config=MANAGED):
        session = boto3.session.Session(region_name="us-west-2")
        yield session, run(session)


def test_state_bucket_is_versioned_encrypted_blocked_and_tls_only(made: Any) -> None:
    aws, result = made
    s3 = aws.client("s3")
    bucket = "acme-gpucluster-state"
    assert s3.get_bucket_location(Bucket=bucket)["LocationConstraint"] == "us-west-2"
    assert s3.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    rule = s3.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"] == {"SSEAlgorithm": "aws:kms",
                                                          "KMSMasterKeyID": result.key_arn}
    assert all(s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"].values())
    statement = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])["Statement"][0]
    assert statement["Effect"] == "Deny"
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert statement["Resource"] == [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"]


def test_kms_key_rotates_and_is_the_secrets_provider(made: Any) -> None:
    aws, result = made
    kms = aws.client("kms")
    key = kms.describe_key(KeyId="alias/gpucluster-state")["KeyMetadata"]
    assert key["Arn"] == result.key_arn
    assert kms.get_key_rotation_status(KeyId=key["KeyId"])["KeyRotationEnabled"] is True
    assert result.secrets_provider == "awskms://alias/gpucluster-state?region=us-west-2"
    assert result.backend_url == "s3://acme-gpucluster-state?region=us-west-2&awssdk=v2"


def test_roles_trust_only_their_github_subject(made: Any) -> None:
    aws, result = made
    iam = aws.client("iam")
    provider = f"arn:aws:iam::{ACCOUNT}:oidc-provider/token.actions.githubusercontent.com"
    assert result.oidc_provider_arn == provider
    assert iam.get_open_id_connect_provider(OpenIDConnectProviderArn=provider)["ClientIDList"] == [
        "sts.amazonaws.com"]
    expected = {"gpucluster-preview": "repo:acme/gpucluster:pull_request",
                "gpucluster-deploy-dev": "repo:acme/gpucluster:environment:dev",
                "gpucluster-deploy-prod": "repo:acme/gpucluster:environment:prod"}
    for name, subject in expected.items():
        trust = iam.get_role(RoleName=name)["Role"]["AssumeRolePolicyDocument"]
        trust = json.loads(trust) if isinstance(trust, str) else trust
        statement = trust["Statement"][0]
        assert statement["Principal"] == {"Federated": provider}
        assert statement["Condition"]["StringEquals"] == {
            "token.actions.githubusercontent.com:aud": "sts.amazonaws.com",
            "token.actions.githubusercontent.com:sub": subject}
    assert result.deploy_role_arns == {env: f"arn:aws:iam::{ACCOUNT}:role/gpucluster-deploy-{env}"
                                       for env in ("dev", "prod")}


def test_role_permissions(made: Any) -> None:
    aws, result = made
    iam = aws.client("iam")
    attached = {p["PolicyArn"] for p in iam.list_attached_role_policies(RoleName="gpucluster-preview")[
        "AttachedPolicies"]}
    assert attached == {"arn:aws:iam::aws:policy/ReadOnlyAccess"}
    deploy = {p["PolicyArn"] for p in iam.list_attached_role_policies(RoleName="gpucluster-deploy-prod")[
        "AttachedPolicies"]}
    assert deploy == {"arn:aws:iam::aws:policy/PowerUserAccess"}
    assert sorted(iam.list_role_policies(RoleName="gpucluster-deploy-prod")["PolicyNames"]) == [
        "cluster-iam", "pulumi-state"]
    state = iam.get_role_policy(RoleName="gpucluster-preview", PolicyName="pulumi-state")["PolicyDocument"]
    state = json.loads(state) if isinstance(state, str) else state
    assert state["Statement"][2] == {"Effect": "Allow", "Resource": result.key_arn, "Action": [
        "kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:DescribeKey"]}
    cluster = bootstrap_state.cluster_iam_policy(ACCOUNT, "gpu-")
    assert cluster["Statement"][0]["Resource"] == [f"arn:aws:iam::{ACCOUNT}:role/gpu-*",
                                                   f"arn:aws:iam::{ACCOUNT}:policy/gpu-*",
                                                   f"arn:aws:iam::{ACCOUNT}:instance-profile/gpu-*"]
    assert all(s["Resource"] != "*" for s in cluster["Statement"] + state["Statement"])


def test_running_twice_reuses_everything(made: Any) -> None:
    aws, first = made
    assert run(aws) == first
    assert len(aws.client("kms").list_keys()["Keys"]) == 1


def test_main_prints_what_github_and_pulumi_need(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws(config=MANAGED):
        assert bootstrap_state.main(["--bucket", "acme-state", "--github-repo", "acme/gpucluster"]) == 0
    out = capsys.readouterr().out
    assert "PULUMI_BACKEND_URL   = s3://acme-state?region=us-east-1&awssdk=v2" in out
    assert f"staging  AWS_ROLE_ARN = arn:aws:iam::{ACCOUNT}:role/gpucluster-deploy-staging" in out
    assert ("pulumi stack init prod --secrets-provider 'awskms://alias/gpucluster-state?region=us-east-1'"
            in out)
