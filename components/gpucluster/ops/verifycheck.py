"""What every `verify` check shares: its outcome, the `Unknown` it raises, and the deployed stack's lookups.

It owns `Outcome` (a check's result, one line of detail, a remedy on fail), `Unknown` (a check could not
run for a reason that is no AWS error) and `Deployed`: the stack's resources as the account holds them,
each looked up once (the Auto Scaling groups, launch templates, node roles, the scripts bucket, the
PCS cluster, the caller's credentials), errors kept and raised to every check that needs them; and
`amp_workspace`, the AMP workspace the nodes write to. `ops.verify` (the checklist) and
`ops.verifyfeatures` (the feature checks) both build on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from gpucluster.fleet.awsapi import group_tags, stack_groups
from gpucluster.fleet.tags import NODE_GROUP_TAG, STACK_TAG
from gpucluster.ops import Clients, OpsError
from gpucluster.ops.verifyiam import Account
from gpucluster.spec import StackSpec, generated_bucket_prefix

Result = Literal["pass", "fail", "unknown"]


@dataclass(frozen=True)
class Outcome:
    """What one check found: its result, one line of detail, and what to do when it failed."""

    result: Result
    detail: str
    remedy: str | None = None


class Unknown(OpsError):
    """A check could not run for a reason that is no AWS error (what it needs was not found)."""


# ------------------------------------------------------------------ what the account holds


class Deployed:
    """The stack's resources as the account holds them, each looked up once (errors too, re-raised)."""

    def __init__(self, spec: StackSpec, clients: Clients, account: Account) -> None:
        self.spec, self.clients, self.account = spec, clients, account
        self._memo: dict[tuple[str, ...], Any] = {}

    def _once(self, key: tuple[str, ...], look: Callable[[], Any]) -> Any:
        if key not in self._memo:
            try:
                self._memo[key] = (True, look())
            except Exception as err:  # kept and raised to every check that needs it
                self._memo[key] = (False, err)
        ok, value = self._memo[key]
        if not ok:
            raise value
        return value

    def groups(self) -> list[dict[str, Any]]:
        """The Auto Scaling groups tagged with the stack (none on a Slurm stack: PCS runs its nodes)."""
        return self._once(("groups",), lambda: stack_groups(self.clients("autoscaling"), self.spec.identity))

    def asg_arns(self, node_groups: set[str] | None = None) -> list[str]:
        """The ARNs of the stack's Auto Scaling groups (only those of `node_groups` when given)."""
        return [str(g["AutoScalingGroupARN"]) for g in self.groups()
                if node_groups is None or group_tags(g).get(NODE_GROUP_TAG) in node_groups]

    def launch_template(self, group: str) -> dict[str, Any]:
        """The default version of the node group's launch template, found by the stack's and group's tags."""
        def look() -> dict[str, Any]:
            ec2 = self.clients("ec2")
            found = ec2.describe_launch_templates(Filters=[
                {"Name": f"tag:{STACK_TAG}", "Values": [self.spec.identity]},
                {"Name": f"tag:{NODE_GROUP_TAG}", "Values": [group]}]).get("LaunchTemplates", [])
            if not found:
                return {}
            if len(found) > 1:
                names = ", ".join(sorted(t["LaunchTemplateName"] for t in found))
                raise Unknown(f"{len(found)} launch templates carry this stack's and group's tags ({names})")
            template = found[0]
            versions = ec2.describe_launch_template_versions(
                LaunchTemplateId=template["LaunchTemplateId"], Versions=["$Default"]
            )["LaunchTemplateVersions"]
            return {**template, "Data": versions[0].get("LaunchTemplateData", {}) if versions else {}}
        return self._once(("lt", group), look)

    def node_role(self, group: str) -> str:
        """The ARN of the node group's role: its launch template's instance profile's role."""
        def look() -> str:
            template = self.launch_template(group)
            if not template:
                raise Unknown(f"no launch template tagged {NODE_GROUP_TAG}={group} to find the node "
                              "role from")
            profile = template["Data"].get("IamInstanceProfile", {})
            name = profile.get("Name") or str(profile.get("Arn", "")).rpartition("/")[2]
            if not name:
                raise Unknown(f"launch template {template['LaunchTemplateName']} names no instance profile")
            found = self.clients("iam").get_instance_profile(InstanceProfileName=name)
            roles = found["InstanceProfile"]["Roles"]
            if not roles:
                raise Unknown(f"instance profile {name} holds no role")
            return str(roles[0]["Arn"])
        return self._once(("role", group), look)

    def credentials(self) -> Any:
        """The caller's AWS credentials, to sign what is no boto3 call (AMP's query API), as `nodes` does."""
        import boto3

        return self._once(("credentials",), lambda: boto3.session.Session(
            region_name=self.account.region).get_credentials())

    def pcs_cluster(self) -> dict[str, Any]:
        """The stack's PCS cluster as GetCluster describes it (found by tag: `ops.pcsclusters`)."""
        from gpucluster.ops.pcsclusters import stack_pcs_cluster

        def look() -> dict[str, Any]:
            pcs = self.clients("pcs")
            found = stack_pcs_cluster(self.spec.identity, pcs)
            return dict(pcs.get_cluster(clusterIdentifier=found)["cluster"])
        return self._once(("pcs",), look)

    def eks(self) -> tuple[Any, Any]:
        """The stack's EKS cluster (found by tag) and a Kubernetes API client as the caller (`ops.eksapi`)."""
        from gpucluster.ops.eksapi import connect

        return self._once(("eks",), lambda: connect(self.spec.identity, self.clients, self.credentials()))

    def scripts_bucket(self) -> str:
        """The node-scripts bucket: the one bucket named with the stack's prefix (aws/nodescripts.py)."""
        def look() -> str:
            prefix = generated_bucket_prefix(self.spec.cluster.name, "node-scripts")
            found = sorted(b["Name"] for b in self.clients("s3").list_buckets().get("Buckets", [])
                           if b["Name"].startswith(prefix))
            if len(found) != 1:
                raise Unknown(f"{len(found)} buckets are named {prefix}*: cannot tell which holds the bundle"
                              if found else f"no bucket named {prefix}* in this account")
            return found[0]
        return self._once(("bucket",), look)


def amp_workspace(deployed: Deployed) -> tuple[str, dict[str, str | list[str]]]:
    """The AMP workspace nodes write to and the context its grant conditions on."""
    from gpucluster.noderole import workspace_arn
    from gpucluster.spec.observability import remote_write_workspace

    a, prometheus = deployed.account, deployed.spec.observability.prometheus
    if prometheus.remote_write_url is not None:
        found = remote_write_workspace(prometheus.remote_write_url)
        if found is None:
            raise Unknown("observability.prometheus.remote_write_url names no AMP workspace")
        return workspace_arn(a.partition, found[0], a.account, found[1]), {}
    pages = deployed.clients("amp").get_paginator("list_workspaces").paginate()
    own = [w for page in pages for w in page.get("workspaces", [])
           if (w.get("tags") or {}).get(STACK_TAG) == deployed.spec.identity]
    if len(own) != 1:
        raise Unknown(f"{len(own)} AMP workspaces are tagged {STACK_TAG}={deployed.spec.identity}")
    return str(own[0]["arn"]), {f"aws:ResourceTag/{STACK_TAG}": deployed.spec.identity}
