"""Guardrail Lambda handlers: boto3 only, never Pulumi.

The deploy zips this directory as the Python package ``lambdas``, so the
handlers are ``lambdas.<module>.handler`` (see ``scaling.HANDLERS``) and
modules here import each other relatively. Nothing here ever deletes an AWS
resource: guardrails only scale Auto Scaling groups to zero and back.
"""
