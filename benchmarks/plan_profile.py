"""Where the time of one `gpucluster plan prod` goes: interpreter, imports by package, validation,
the mock engine, policies, cost, rendering, and what the garbage collector would add.

One fresh process per round runs the command's steps in order under `-X importtime`, timing
each step; imports are attributed to the package that defines each module (its own time, not
its children's), wherever they happen (pulumi_aws service modules load while the program
runs: they are counted as imports, and the mock engine's line is what is left). Medians of
`--runs` rounds, in milliseconds.

    .venv/bin/python benchmarks/plan_profile.py [--runs 5] [--stack prod]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from plan_time import write_bytecode  # this folder is the script's: sys.path[0]

REPO = Path(__file__).resolve().parent.parent

CHILD = r"""
import gc, json, sys, time
stack = sys.argv[1]
collect = sys.argv[2] == "gc"
gc_seconds, started = [0.0], [0.0]
def on_gc(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        gc_seconds[0] += time.perf_counter() - started[0]
if collect:
    gc.callbacks.append(on_gc)
else:
    gc.disable()  # what `gpucluster` does (gpucluster.cli.main)
marks = [("start", time.perf_counter())]
def mark(name):
    marks.append((name, time.perf_counter()))
from gpucluster.cli import planning, render
mark("import the CLI")
from gpucluster import program
mark("import the program")
from gpucluster.plan import load_stack, run_program
name, config, spec = load_stack(stack)
mark("validate the stack file")
plan = run_program(name, config, spec)
mark("run the program under the mock engine")
violations, notes = planning.check_policies(plan, None)
mark("policies")
cost = planning.plan_cost(plan.spec)
mark("cost")
document = plan.as_json()
document["cost"] = cost.as_json()
document["violations"] = [v.as_json() for v in violations]
text = json.dumps(document, indent=2)
lines = render.plan_lines(plan, cost, violations, False, notes)
mark("render (--json and text)")
warm = time.perf_counter()
again = run_program(name, config, spec)
warm = time.perf_counter() - warm
print(json.dumps({"marks": marks, "resources": len(plan.resources), "warm_run": warm,
                  "gc": gc_seconds[0]}), file=sys.__stdout__)
"""

IMPORT_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)")


def package(module: str) -> str:
    top = module.split(".")[0]
    if top == "pulumi_aws":  # its top level (provider, functions) vs the service packages' modules
        return "pulumi_aws service modules" if module.count(".") >= 2 else "pulumi_aws top level"
    if top == "gpucluster":
        part = module.split(".")[1] if "." in module else ""
        return {"aws": "gpucluster.aws (components)", "cli": "gpucluster.cli",
                "policy": "gpucluster.policy"}.get(part, "gpucluster (spec, pricing, catalog, plan, ...)")
    if top in ("pulumi", "grpc", "google", "opentelemetry", "dill", "semver", "pulumi_policy"):
        return "pulumi (+ grpc, protobuf, opentelemetry)"
    if top in ("typer", "click", "rich", "pydantic", "pydantic_core", "yaml", "boto3", "botocore"):
        return {"pydantic_core": "pydantic"}.get(top, top)
    return "stdlib and the rest"


def one_round(stack: str, collect: bool) -> dict:
    start = time.perf_counter()
    command = [sys.executable, "-X", "importtime", "-c", CHILD, stack, "gc" if collect else "off"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    total = time.perf_counter() - start
    result = json.loads(done.stdout.strip().splitlines()[-1])
    imports: dict[str, float] = defaultdict(float)
    for line in done.stderr.splitlines():
        match = IMPORT_LINE.match(line)
        if match:
            imports[package(match.group(4))] += int(match.group(1)) / 1e6
    marks = result["marks"]
    steps = {name: t - marks[i][1] for i, (name, t) in enumerate(marks[1:])}
    return {"total": total, "steps": steps, "imports": dict(imports), "resources": result["resources"],
            "warm_run": result["warm_run"], "gc": result["gc"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stack", default="prod")
    args = parser.parse_args()
    write_bytecode([[sys.executable, "-m", "gpucluster.cli", "plan", args.stack]])  # as installed
    rounds = [one_round(args.stack, collect=False) for _ in range(args.runs)]
    with_gc = [one_round(args.stack, collect=True) for _ in range(max(2, args.runs // 2))]
    bare = statistics.median(
        _wall([sys.executable, "-c", "pass"]) for _ in range(args.runs))

    def med(values: list[float]) -> float:
        return statistics.median(values) * 1000

    total = med([r["total"] for r in rounds])
    print(f"gpucluster plan {args.stack}: where the time goes (median of {args.runs}, ms; under "
          f"-X importtime, which adds a little to imports)")
    print(f"  {'the whole process':44s} {total:7.0f}")
    print(f"  {'interpreter start (python -c pass)':44s} {bare * 1000:7.0f}")
    print("  steps (each includes the imports it triggers):")
    for name in rounds[0]["steps"]:
        print(f"    {name:42s} {med([r['steps'][name] for r in rounds]):7.0f}")
    print("  imports, by package (own time of each module, wherever it was imported):")
    names = sorted({k for r in rounds for k in r["imports"]},
                   key=lambda k: -statistics.median(r["imports"].get(k, 0) for r in rounds))
    for name in names:
        print(f"    {name:42s} {med([r['imports'].get(name, 0.0) for r in rounds]):7.0f}")
    resources = rounds[0]["resources"]
    warm = med([r["warm_run"] for r in rounds])
    print(f"  the mock engine alone (the program run again, everything imported): {warm:.0f} ms for "
          f"{resources} resources, {warm / resources:.2f} ms a resource")
    print(f"  the garbage collector if left on (gpucluster turns it off): "
          f"{med([r['gc'] for r in with_gc]):.0f} ms during the plan, and "
          f"{med([r['total'] for r in with_gc]) - total:.0f} ms more in all (exit included)")


def _wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
