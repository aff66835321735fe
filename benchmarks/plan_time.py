"""Benchmark `gpucluster plan`: wall time per shipped stack and how plans scale with nodes.

Each figure is the median of several runs of the real command in a fresh
process (import time included: that is what a user waits for). The scaling
part plans one node group at 1, 8, 64 and 512 nodes and reports the resource
count, which must not grow with the node count (nodes are an ASG's capacity,
not resources).

    .venv/bin/python benchmarks/plan_time.py [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
GPUCLUSTER = [sys.executable, "-m", "gpucluster.cli"]


def time_plan(stack: str, runs: int) -> tuple[float, int]:
    """Median seconds of `gpucluster plan STACK --json`, and the resource count."""
    times, count = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run([*GPUCLUSTER, "plan", stack, "--json"], cwd=REPO,
                              capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode not in (0, 1):  # 1: a mandatory policy violation, still a full plan
            raise SystemExit(f"plan {stack} failed ({done.returncode}): {done.stderr.strip()}")
        out = done.stdout
        count = len(json.loads(out)["resources"])
    return statistics.median(times), count


def scaled_stack(base: dict, nodes: int, directory: Path) -> Path:
    config = json.loads(json.dumps(base))
    group = config["config"]["gpucluster:node_groups"][0]
    group.update(min_nodes=0, desired_nodes=nodes, max_nodes=nodes)
    group["capacity"]["on_demand_base"] = min(group["capacity"].get("on_demand_base", 0), nodes)
    path = directory / f"Pulumi.scale-{nodes}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    print(f"gpucluster plan, median of {args.runs} runs (fresh process each)")
    for stack in ("dev", "staging", "prod"):
        seconds, count = time_plan(stack, args.runs)
        print(f"  {stack:8s} {seconds:6.2f} s  {count:4d} resources")

    base = yaml.safe_load((REPO / "stacks" / "Pulumi.prod.yaml").read_text())
    print("one node group (prod's), by node count (512 nodes breaks prod's 256-GPU policy: exit 1):")
    with tempfile.TemporaryDirectory() as tmp:
        for nodes in (1, 8, 64, 512):
            seconds, count = time_plan(str(scaled_stack(base, nodes, Path(tmp))), args.runs)
            print(f"  {nodes:4d} nodes {seconds:6.2f} s  {count:4d} resources")


if __name__ == "__main__":
    main()
