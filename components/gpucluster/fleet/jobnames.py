"""The names a detached job goes by outside its nodes: its restart record, its log stream, its event.

Pure (the standard library only): the restart handler uses them in AWS, and the Pulumi
program (`gpucluster.aws.guardrails`), the operator policy and the CLI build the same names
without importing the handler, whose boto3 a plan would otherwise load for two strings.
"""

from __future__ import annotations

import re

from .nodepaths import JOB_LOG_DIR

LAUNCH_SUCCESSFUL = "EC2 Instance Launch Successful"
"""EventBridge detail-type of a successful Auto Scaling launch (EC2 Auto Scaling user guide,
"Amazon EC2 Auto Scaling event reference")."""


def jobs_parameter_path(identity: str) -> str:
    """/gpucluster/<identity>/jobs: SSM parameter names allow a-z, A-Z, 0-9 and _.-/ only."""
    return f"/gpucluster/{re.sub(r'[^A-Za-z0-9_./-]', '-', identity)}/jobs"


def job_parameter_name(identity: str, job: str) -> str:
    return f"{jobs_parameter_path(identity)}/{job}"


def job_log_stream(instance_id: str, job: str) -> str:
    """The run log group stream of `job` on `instance_id`: the CloudWatch agent names a
    publish_multi_logs file's stream <log_stream_name>_<path with '/' as '_'>
    (amazon-cloudwatch-agent, plugins/inputs/logfile/logfile.go), log_stream_name {instance_id}."""
    return f"{instance_id}_{JOB_LOG_DIR}/{job}.log".replace("/", "_")
