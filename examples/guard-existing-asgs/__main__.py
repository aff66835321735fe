"""Guardrails for Auto Scaling groups gpucluster did not create (an EKS managed node group's, say).

A monthly budget that scales the groups to zero at 100 % (data is never
touched), an idle stop when even the busiest GPU stays under 5 % for an hour,
and a nightly stop. `tag_groups` puts the `gpucluster:stack` tag on each group:
the guardrail Lambdas find the groups by it and their IAM conditions require it.
Idle stop watches the GPU metric gpucluster's node bootstrap publishes; on nodes
that do not publish it the alarm notifies instead of stopping.
"""

import pulumi

from gpucluster import Guardrails

config = pulumi.Config()

guardrails = Guardrails("eks-gpu", {
    "cluster_name": "eks-gpu",
    "identity": f"{pulumi.get_project()}/{pulumi.get_stack()}",
    "region": pulumi.Config("aws").require("region"),
    "groups": config.require_object("groups"),
    "tag_groups": True,
    "tags": {"team": "ml-platform"},
    "budget": {"monthly_limit_usd": 20000, "alert_thresholds_percent": [50, 80],
               "action_threshold_percent": 100, "emails": config.require_object("budget_emails")},
    "autostop": {"enabled": True, "idle_minutes": 60, "gpu_utilization_threshold_percent": 5,
                 "stop_schedule": "cron(0 20 ? * MON-FRI *)", "schedule_timezone": "Europe/Berlin"},
})

pulumi.export("notify_topic_arn", guardrails.notify_topic_arn)
pulumi.export("function_names", guardrails.function_names)
