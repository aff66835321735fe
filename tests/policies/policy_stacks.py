"""Stacks built from real pulumi_aws resources under the recording mock engine, for the policy tests.

`good_stack` is what the node-group, dataset and guardrail components are meant
to build (every rule passes); `broken_stack` makes one deliberate mistake per
rule. Both come back as the records `gpucluster plan` hands the rules, so the
tests read the engine's own input names, not hand-typed ones.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws

from gpucluster.plan import PlanMocks, record_resources
from gpucluster.policy.offline import record_of
from gpucluster.policy.records import Resource

OWNER, COST_CENTER = "ml-platform", "research-1234"


def tags(environment: str, **drop: bool) -> dict[str, str]:
    found = {"owner": OWNER, "cost_center": COST_CENTER, "environment": environment,
             "gpucluster:stack": environment}
    return {k: v for k, v in found.items() if not drop.get(k)}


def _record(build: Any, region: str = "us-east-1") -> list[Resource]:
    planned, _ = record_resources(build, stack="policies", region=region)
    mocks = PlanMocks(region)
    return [record_of(r, mocks) for r in planned]


def _tls_policy(bucket: aws.s3.Bucket) -> pulumi.Output[str]:
    return bucket.arn.apply(lambda arn: json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "DenyPlainHttp", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": [arn, f"{arn}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }],
    }))


def _one_type_group(name: str, launch_template: aws.ec2.LaunchTemplate, instance_type: str, t: dict[str, str],
                    distribution: aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs,
                    **group: Any) -> aws.autoscaling.Group:
    """An Auto Scaling group of one instance type from `launch_template`, its tags propagated at launch."""
    return aws.autoscaling.Group(
        name,
        mixed_instances_policy=aws.autoscaling.GroupMixedInstancesPolicyArgs(
            instances_distribution=distribution,
            launch_template=aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateArgs(
                launch_template_specification=aws.autoscaling.
                GroupMixedInstancesPolicyLaunchTemplateLaunchTemplateSpecificationArgs(
                    launch_template_id=launch_template.id, version="$Latest"),
                overrides=[aws.autoscaling.GroupMixedInstancesPolicyLaunchTemplateOverrideArgs(
                    instance_type=instance_type)])),
        tags=[aws.autoscaling.GroupTagArgs(key=k, value=v, propagate_at_launch=True) for k, v in t.items()],
        **group)


def good_stack(environment: str = "staging") -> list[Resource]:
    """An EFA p4d group, a protected data bucket, node IAM, a budget that acts, and auto-stop."""

    def build() -> None:
        t = tags(environment)
        efa_sg = aws.ec2.SecurityGroup("c-efa", vpc_id="vpc-0abc12345def67890", tags=t,
                                       description="EFA: all traffic within the group")
        aws.vpc.SecurityGroupIngressRule("c-efa-in", security_group_id=efa_sg.id,
                                         referenced_security_group_id=efa_sg.id, ip_protocol="-1", tags=t)
        aws.vpc.SecurityGroupEgressRule("c-efa-out", security_group_id=efa_sg.id,
                                        referenced_security_group_id=efa_sg.id, ip_protocol="-1", tags=t)
        aws.vpc.SecurityGroupEgressRule("c-https-out", security_group_id=efa_sg.id,
                                        cidr_ipv4="0.0.0.0/0", ip_protocol="tcp", from_port=443,
                                        to_port=443, tags=t)
        pg = aws.ec2.PlacementGroup("c-pg", strategy="cluster", tags=t)
        nics = [aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            network_card_index=card, device_index=0, interface_type="efa" if card == 0 else "efa-only",
            security_groups=[efa_sg.id], subnet_id="subnet-0abc12345def67890",
            associate_public_ip_address="false", delete_on_termination="true") for card in range(4)]
        lt = aws.ec2.LaunchTemplate(
            "c-train", image_id="ami-0123456789abcdef0", network_interfaces=nics,
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_tokens="required", http_endpoint="enabled", http_put_response_hop_limit=2),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name="/dev/xvda", ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    encrypted="true", volume_size=500, volume_type="gp3"))],
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=t)
                                for kind in ("instance", "volume")],
            placement=aws.ec2.LaunchTemplatePlacementArgs(group_name=pg.name),
            tags=t)
        asg = _one_type_group(
            "c-train", lt, "p4d.24xlarge", t,
            aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                on_demand_base_capacity=2, on_demand_percentage_above_base_capacity=0,
                spot_allocation_strategy="capacity-optimized"),
            min_size=0, max_size=4, desired_capacity=2,
            vpc_zone_identifiers=["subnet-0abc12345def67890"], placement_group=pg.id,
            opts=pulumi.ResourceOptions(ignore_changes=["desiredCapacity"]))

        data = aws.s3.Bucket("c-data", tags=t,
                             opts=pulumi.ResourceOptions(protect=True, retain_on_delete=True))
        aws.s3.BucketServerSideEncryptionConfiguration(
            "c-data-sse", bucket=data.id,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.
                BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="aws:kms"), bucket_key_enabled=True)])
        aws.s3.BucketPublicAccessBlock("c-data-pab", bucket=data.id, block_public_acls=True,
                                       block_public_policy=True, ignore_public_acls=True,
                                       restrict_public_buckets=True)
        aws.s3.BucketPolicy("c-data-tls", bucket=data.id, policy=_tls_policy(data))
        aws.s3.BucketVersioning("c-data-versions", bucket=data.id,
                                versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(
                                    status="Enabled"))

        role = aws.iam.Role("c-node", tags=t, assume_role_policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                    "Principal": {"Service": "ec2.amazonaws.com"}}]}))
        aws.iam.RolePolicy("c-node-data", role=role.name, policy=data.arn.apply(lambda arn: json.dumps({
            "Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": ["s3:GetObject", "s3:ListBucket"],
                 "Resource": [arn, f"{arn}/*"]}]})))
        aws.iam.RolePolicyAttachment("c-node-ssm", role=role.name,
                                     policy_arn="arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore")

        topic = aws.sns.Topic("c-budget", tags=t, kms_master_key_id="alias/aws/sns")
        fn = aws.lambda_.Function("c-scale-to-zero", role=role.arn, runtime="python3.12",
                                  handler="budget_action.handler", code=pulumi.AssetArchive({}), tags=t)
        aws.sns.TopicSubscription("c-budget-fn", topic=topic.arn, protocol="lambda", endpoint=fn.arn)
        aws.budgets.Budget("c-budget", budget_type="COST", limit_amount="15000", limit_unit="USD",
                           time_unit="MONTHLY", tags=t,
                           notifications=[aws.budgets.BudgetNotificationArgs(
                               comparison_operator="GREATER_THAN", threshold=100,
                               threshold_type="PERCENTAGE", notification_type="ACTUAL",
                               subscriber_sns_topic_arns=[topic.arn])])
        aws.cloudwatch.MetricAlarm("c-train-idle", comparison_operator="LessThanThreshold",
                                   evaluation_periods=6, metric_name="GPUUtilization",
                                   namespace="GpuCluster", period=300, statistic="Average", threshold=5,
                                   dimensions={"AutoScalingGroupName": asg.name},
                                   alarm_actions=[topic.arn], tags=t)
        aws.cloudwatch.EventRule("c-stop-nightly", schedule_expression="cron(0 19 ? * * *)", tags=t)

    return _record(build)


def broken_stack() -> list[Resource]:
    """A dev stack with one deliberate mistake per policy (named in each resource's comment)."""

    def build() -> None:
        t = tags("dev")
        # efa-wiring: the EFA group lets traffic in from itself but not out to itself
        efa_sg = aws.ec2.SecurityGroup("b-efa", vpc_id="vpc-0abc12345def67890", tags=t,
                                       ingress=[aws.ec2.SecurityGroupIngressArgs(
                                           protocol="-1", from_port=0, to_port=0, self=True)])
        # no-open-ingress: SSH from anywhere
        aws.vpc.SecurityGroupIngressRule("b-ssh", security_group_id=efa_sg.id, cidr_ipv4="0.0.0.0/0",
                                         ip_protocol="tcp", from_port=22, to_port=22, tags=t)
        # efa-wiring: a spread placement group
        pg = aws.ec2.PlacementGroup("b-pg", strategy="spread", tags=t)
        lt = aws.ec2.LaunchTemplate(
            "b-train", image_id="ami-0123456789abcdef0",
            network_interfaces=[aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                network_card_index=0, device_index=0, interface_type="efa", security_groups=[efa_sg.id],
                # no-public-ip-on-gpu-nodes
                associate_public_ip_address="true")],
            # imdsv2-required: tokens optional
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(http_tokens="optional"),
            # encrypted-volumes
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name="/dev/xvda", ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    encrypted="false", volume_size=200))],
            tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=t)
                                for kind in ("instance", "volume")],
            tags=t)
        # environment-limits: on-demand p5 in dev; efa-wiring: two subnets
        _one_type_group(
            "b-train", lt, "p5.48xlarge", t,
            aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(on_demand_base_capacity=2),
            min_size=0, max_size=2,
            vpc_zone_identifiers=["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"],
            placement_group=pg.id)
        # intra-group-traffic: a three-node group whose nodes cannot reach each other, and whose
        # security group lets all traffic in from a whole /8
        serve_sg = aws.ec2.SecurityGroup("b-serve", vpc_id="vpc-0abc12345def67890", tags=t)
        aws.vpc.SecurityGroupIngressRule("b-serve-all", security_group_id=serve_sg.id,
                                         cidr_ipv4="10.0.0.0/8", ip_protocol="-1", tags=t)
        serve_lt = aws.ec2.LaunchTemplate(
            "b-serve", image_id="ami-0123456789abcdef0",
            network_interfaces=[aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                network_card_index=0, device_index=0, security_groups=[serve_sg.id],
                associate_public_ip_address="false")],
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(http_tokens="required"),
            tags=t)
        _one_type_group(
            "b-serve", serve_lt, "g5.xlarge", t,
            aws.autoscaling.GroupMixedInstancesPolicyInstancesDistributionArgs(
                on_demand_base_capacity=0, on_demand_percentage_above_base_capacity=0),
            min_size=0, max_size=3, vpc_zone_identifiers=["subnet-0aaaaaaaaaaaaaaaa"])
        # s3-encryption, s3-tls-only (no SSE config, no policy); s3-data-buckets-protected:
        # unprotected and force-destroyed, unversioned
        data = aws.s3.Bucket("b-data", tags=t, force_destroy=True)
        # s3-lifecycle-keeps-data: current objects expire, old versions the same day
        aws.s3.BucketLifecycleConfiguration("b-data-lifecycle", bucket=data.id, rules=[
            aws.s3.BucketLifecycleConfigurationRuleArgs(
                id="purge", status="Enabled",
                expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=30),
                noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                    noncurrent_days=0))])
        # s3-public-access-blocked: public policies allowed
        aws.s3.BucketPublicAccessBlock("b-data-pab", bucket=data.id, block_public_acls=True,
                                       block_public_policy=False, ignore_public_acls=True,
                                       restrict_public_buckets=True)
        # iam-no-wildcard-admin
        aws.iam.Policy("b-admin", tags=t, policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        # gpu-budget-with-action: e-mail only; required-cost-tags: no cost_center;
        # nonprod-autostop: no idle alarm and no schedule anywhere
        aws.budgets.Budget("b-budget", budget_type="COST", limit_amount="500", limit_unit="USD",
                           time_unit="MONTHLY", tags=tags("dev", cost_center=True),
                           notifications=[aws.budgets.BudgetNotificationArgs(
                               comparison_operator="GREATER_THAN", threshold=100,
                               threshold_type="PERCENTAGE", notification_type="ACTUAL",
                               subscriber_email_addresses=["ml-platform@example.com"])])
        _broken_pcs(t, lt, serve_lt)
        _broken_eks(t)

    return _record(build)


def _broken_eks(t: dict[str, str]) -> None:
    """The EKS part of the broken stack: a prod cluster with a public endpoint, one log type and no
    secrets encryption (eks-private-endpoint, eks-control-plane-logging, eks-secrets-encrypted), and a
    managed node group of GPUs (eks-system-nodes-no-gpu)."""
    cluster = aws.eks.Cluster("b-eks", role_arn="arn:aws:iam::123456789012:role/eks", version="1.34",
                              vpc_config=aws.eks.ClusterVpcConfigArgs(
                                  subnet_ids=["subnet-0aaaaaaaaaaaaaaaa"], endpoint_public_access=True),
                              enabled_cluster_log_types=["api"], tags=tags("prod"))
    aws.eks.NodeGroup("b-eks-system", cluster_name=cluster.name,
                      node_role_arn="arn:aws:iam::123456789012:role/n",
                      subnet_ids=["subnet-0aaaaaaaaaaaaaaaa"], instance_types=["p5.48xlarge"], tags=t,
                      scaling_config=aws.eks.NodeGroupScalingConfigArgs(desired_size=1, min_size=1,
                                                                        max_size=1))


def _broken_pcs(t: dict[str, str], train_lt: aws.ec2.LaunchTemplate,
                serve_lt: aws.ec2.LaunchTemplate) -> None:
    """The AWS PCS part of the broken stack, as pulumi-aws-native records it (engine names, camelCase).

    Built as plain custom resources of the aws-native type tokens: the rules read only the tokens and inputs.
    """
    # pcs-node-instance-profile: a role neither AWSPCS... nor /aws-pcs/, and not allowed to register
    role = aws.iam.Role("b-pcs-node", name="gpu-nodes", tags=t, assume_role_policy=json.dumps({
        "Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole",
                                                "Principal": {"Service": "ec2.amazonaws.com"}}]}))
    profile = aws.iam.InstanceProfile("b-pcs-profile", name="gpu-nodes", role=role.name, tags=t)
    # pcs-slurm-traffic: the controller's group admits nothing from the nodes
    ctl_sg = aws.ec2.SecurityGroup("b-pcs-ctl", vpc_id="vpc-0abc12345def67890", tags=t)
    # pcs-accounting: a prod-tagged cluster without accounting
    cluster = pulumi.CustomResource("aws-native:pcs:Cluster", "b-pcs", {
        "scheduler": {"type": "SLURM", "version": "25.05"}, "size": "SMALL",
        "networking": {"subnetIds": ["subnet-0aaaaaaaaaaaaaaaa"], "securityGroupIds": [ctl_sg.id]},
        "slurmConfiguration": {"accounting": {"mode": "NONE"}}, "tags": tags("prod")})
    # pcs-launch-template: the b-train template allows IMDSv1 and gives a public IP
    pulumi.CustomResource("aws-native:pcs:ComputeNodeGroup", "b-pcs-train", {
        "clusterId": cluster.id, "name": "train", "iamInstanceProfileArn": profile.arn,
        "customLaunchTemplate": {"templateId": train_lt.id, "version": "1"},
        "instanceConfigs": [{"instanceType": "p5.48xlarge"}], "subnetIds": ["subnet-0aaaaaaaaaaaaaaaa"],
        "scalingConfiguration": {"minInstanceCount": 0, "maxInstanceCount": 2}, "tags": t})
    # pcs-login-no-gpu: a GPU login group
    pulumi.CustomResource("aws-native:pcs:ComputeNodeGroup", "b-pcs-login", {
        "clusterId": cluster.id, "name": "login", "iamInstanceProfileArn": profile.arn,
        "customLaunchTemplate": {"templateId": serve_lt.id, "version": "1"},
        "instanceConfigs": [{"instanceType": "g5.xlarge"}], "subnetIds": ["subnet-0aaaaaaaaaaaaaaaa"],
        "scalingConfiguration": {"minInstanceCount": 1, "maxInstanceCount": 1}, "tags": t})
