"""The fleet core: what a stop, a start and a job mean, wherever it runs. boto3 only, never Pulumi.

The guardrail Lambdas (`gpucluster.lambdas`, thin handlers) and the day-2 operations
(`gpucluster.ops`) both act through it. It holds the node-group seam (`nodegroups`: the values,
rules and the `NodeGroups` interface) and its backends (`asg`: Auto Scaling tags;
`guardstate`: the DynamoDB guard state over a `Capacity`, Auto Scaling's or `pcsgroups`' AWS PCS
compute node groups; `backends`: which one runs a deployment's groups), stopping several groups
(`stops`), the Slurm commands of a stop and a start (`slurmhold`), SSM Run Command (`runcommand`),
the AWS helpers (`awsapi`) and the handler's runtime seams (`runtime`), the names and tags shared
across the Lambda boundary (`tags`, `jobnames`, `deployment`), and the decisions the handlers make
(`accrual`, `spendguard`, `spendreport`, `jobrecords`). Nothing here ever deletes an AWS resource.

It imports only its own modules (relatively), the standard library and boto3: the Lambda archive
carries it as `gpucluster/fleet/` beside the handlers (`gpucluster.aws.guardrail_lambda`), with a
`gpucluster/__init__.py` of its own, so it must import nothing else of gpucluster.
"""
