"""The handler table: every entry point exists, and the package never imports Pulumi."""

from __future__ import annotations

from gpucluster import lambdas
from gpucluster.fleet import deployment, runtime


def test_handler_table_points_at_real_handlers() -> None:
    import importlib

    assert set(deployment.HANDLERS) == set(deployment.IAM_ACTIONS) == set(deployment.ENVIRONMENT)
    for name, target in deployment.HANDLERS.items():
        package, module, function = target.split(".")
        assert (package, module, function) == ("lambdas", name, "handler")
        assert callable(getattr(importlib.import_module(f"gpucluster.lambdas.{module}"), function))


def test_no_pulumi_import_in_the_lambda_package() -> None:
    import ast
    from pathlib import Path

    for path in [*Path(runtime.__file__).parent.glob("*.py"), *Path(lambdas.__file__).parent.glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] in {"pulumi", "pulumi_aws"} for n in names), path
