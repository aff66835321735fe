"""Day-2 operations against AWS (boto3): one module a concern, clients passed in, no Pulumi import."""
