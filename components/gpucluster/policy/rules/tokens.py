"""The engine type tokens the policy rules look for (pulumi-aws 7), in one place.

Rules match resources by these tokens (`Resource.type`, as `pulumi preview` and
the mock engine name them); a token used by one rule only still lives here so
a provider rename is one edit. Constants only: no rule, no Pulumi import.
"""

from __future__ import annotations

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
EBS_VOLUME = "aws:ebs/volume:Volume"
ASG = "aws:autoscaling/group:Group"
ASG_SCHEDULE = "aws:autoscaling/schedule:Schedule"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SG_INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SG_EGRESS_RULE = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
SG_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
PLACEMENT_GROUP = "aws:ec2/placementGroup:PlacementGroup"
BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
BUCKET_SSE = ("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
              "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2")
BUCKET_PAB = ("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",)
BUCKET_POLICY = ("aws:s3/bucketPolicy:BucketPolicy",)
BUCKET_ACL = ("aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2")
BUCKET_VERSIONING = ("aws:s3/bucketVersioning:BucketVersioning",
                     "aws:s3/bucketVersioningV2:BucketVersioningV2")
BUCKET_LIFECYCLE = ("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
                    "aws:s3/bucketLifecycleConfigurationV2:BucketLifecycleConfigurationV2")
BUDGET = "aws:budgets/budget:Budget"
BUDGET_ACTION = "aws:budgets/budgetAction:BudgetAction"
SNS_TOPIC = "aws:sns/topic:Topic"
SNS_SUBSCRIPTION = "aws:sns/topicSubscription:TopicSubscription"
METRIC_ALARM = "aws:cloudwatch/metricAlarm:MetricAlarm"
EVENT_RULE = "aws:cloudwatch/eventRule:EventRule"
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
SCHEDULER_SCHEDULE = "aws:scheduler/schedule:Schedule"
IAM_POLICY_DOCS: dict[str, str] = {
    "aws:iam/policy:Policy": "policy",
    "aws:iam/rolePolicy:RolePolicy": "policy",
    "aws:iam/userPolicy:UserPolicy": "policy",
    "aws:iam/groupPolicy:GroupPolicy": "policy",
}
IAM_ROLE = "aws:iam/role:Role"
IAM_ATTACHMENTS = ("aws:iam/rolePolicyAttachment:RolePolicyAttachment",
                   "aws:iam/policyAttachment:PolicyAttachment",
                   "aws:iam/userPolicyAttachment:UserPolicyAttachment",
                   "aws:iam/groupPolicyAttachment:GroupPolicyAttachment")
IAM_INSTANCE_PROFILE = "aws:iam/instanceProfile:InstanceProfile"
IAM_MANAGED_POLICY = "aws:iam/policy:Policy"
IAM_ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
# AWS PCS has no resources in pulumi-aws 7: the stack makes them with pulumi-aws-native (CloudFormation's
# AWS::PCS::* schema, camelCase inputs: clusterId, customLaunchTemplate, iamInstanceProfileArn ...).
PCS_CLUSTER = "aws-native:pcs:Cluster"
PCS_NODE_GROUP = "aws-native:pcs:ComputeNodeGroup"
PCS_QUEUE = "aws-native:pcs:Queue"
EKS_CLUSTER = "aws:eks/cluster:Cluster"
EKS_NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
