"""Guardrail Lambda handlers: boto3 only, never Pulumi.

The deploy zips this directory as the Python package ``lambdas``, so the
handlers are ``lambdas.<module>.handler`` (see ``handlers.HANDLERS``) and
modules here import each other relatively. Nothing here ever deletes an AWS
resource: guardrails only scale node groups to zero and back, through the
``nodegroups`` seam (``stops`` for several at once, ``asg`` its Auto Scaling
backend, ``guardstate`` the stored one over Auto Scaling or ``pcs``'s PCS compute node
groups, ``slurmhold`` the Slurm commands on a Slurm stack); ``awsapi`` holds the AWS
helpers they share with ``gpucluster.ops``.
"""
