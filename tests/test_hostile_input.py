"""Hostile stack input: every file ends in exit 0, 1 or 2 within a second, with short output.

Each case of issue 12's "Bad input never crashes, hangs or floods" is a named test
here, through `gpucluster plan <file>` as a user runs it, and through the config
path `pulumi up` takes (every value a string in PULUMI_CONFIG, JSON for the rest).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pulumi
import pytest
from click.testing import Result
from pulumi.runtime.config import set_all_config
from typer.testing import CliRunner

from base_config import BASE_CONFIG, plan_config
from gpucluster import program
from gpucluster.cli import app
from gpucluster.plan import load_stack, record_resources
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import MAX_FINDINGS, MAX_LINE_CHARS, SHOWN_CHARS, SpecError

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent
DEV = (REPO / "stacks" / "Pulumi.dev.yaml").read_text()
SECONDS = 1.0
"""Any hostile file is answered within this (a good one takes milliseconds to validate)."""


def with_config_lines(*lines: str) -> str:
    """The dev stack with `lines` added at the top of its `config:` mapping."""
    return DEV.replace("config:\n", "config:\n" + "".join(f"  {line}\n" for line in lines), 1)


def plan(tmp_path: Path, text: str, name: str = "hostile") -> Result:
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(text)
    started = time.perf_counter()
    result = runner.invoke(app, ["plan", str(path)])
    assert time.perf_counter() - started < SECONDS * 5  # a whole plan (exit 0) takes ~1 s
    return result


def refused(result: Result, where: str, fragment: str) -> str:
    """Exit 2, no traceback, a short line naming `where` (or a key below it) with `fragment`."""
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.output.splitlines()
    assert all(len(line) <= MAX_LINE_CHARS for line in lines), max(lines, key=len)
    assert lines[0].startswith("invalid stack config: ")
    hits = [line for line in lines[1:] if line.startswith(where) and ": " in line[len(where):]]
    assert hits and any(fragment in line for line in hits), result.output
    return hits[0]


def time_to_refuse(text: str) -> float:
    """Seconds `load_stack` takes to reject `text` (it must reject it)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "Pulumi.t.yaml"
        path.write_text(text)
        started = time.perf_counter()
        with pytest.raises(SpecError):
            load_stack(str(path))
        return time.perf_counter() - started


# ------------------------------------------------------------------ item 7: YAML itself

TAGS = {
    "binary": "!!binary aGVsbG8=",
    "set": "!!set {a, b}",
    "omap": "!!omap [a: 1]",
    "timestamp": "!!timestamp 2024-01-01",
    "python-object": "!!python/object/apply:os.system [touch /tmp/gpucluster-pwned]",
    "local": "!vault secret",
    "verbatim": "!<tag:example.com,2024:x> y",
}
# Keys the program validates, one it ignores (`aws:*`), one of another namespace.
KEYS = {
    "gpucluster": ("gpucluster:spot: {interruption_command: %s}", "spot.interruption_command"),
    "aws": ("aws:profile: %s", "aws:profile"),
    "ignored": ("other:thing: %s", "other:thing"),
}


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("tag", TAGS)
def test_yaml_tags_other_than_plain_ones_exit_2_naming_the_key(tmp_path: Path, tag: str, key: str) -> None:
    template, where = KEYS[key]
    line = refused(plan(tmp_path, with_config_lines(template % TAGS[tag])), where, "is not allowed")
    assert "line 5" in line  # where in the file, too
    assert not Path("/tmp/gpucluster-pwned").exists()


def test_explicit_plain_tags_are_read_as_written(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(with_config_lines("other:n: !!str 12", "other:d: 2024-01-01", "other:z: !!null ''"))
    _, config, _ = load_stack(str(path))
    assert (config["other:n"], config["other:d"], config["other:z"]) == ("12", "2024-01-01", None)


@pytest.mark.parametrize("text", ["!!int twelve", "!!float x", "!!bool maybe"])
def test_a_plain_tag_on_text_that_is_not_one_exits_2(tmp_path: Path, text: str) -> None:
    refused(plan(tmp_path, with_config_lines(f"other:x: {text}")), "other:x", "is not a valid !!")


def alias_bomb(levels: int = 9) -> list[str]:
    """The billion-laughs shape: 9 aliases per level, 9**levels values expanded, ~1 KB of YAML."""
    lines = ["bomb:a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        prev, this = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"bomb:{this}: &{this} [{', '.join([f'*{prev}'] * 9)}]")
    return lines


def test_alias_bomb_is_refused_at_once(tmp_path: Path) -> None:
    text = with_config_lines(*alias_bomb())
    assert len(text) - len(DEV) < 1100
    refused(plan(tmp_path, text), "bomb:e[0]", "more than 10000 values with YAML aliases expanded")
    assert time_to_refuse(text) < 0.1


def test_alias_bomb_outside_config_is_refused_too(tmp_path: Path) -> None:
    bomb = "".join(f"  {line.removeprefix('bomb:')}\n" for line in alias_bomb())
    refused(plan(tmp_path, "x-anchors:\n" + bomb + DEV), "x-anchors.e[0]", "aliases expanded")


def test_aliases_that_stay_small_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(with_config_lines("other:a: &zones [us-east-1a]", "other:b: *zones",
                                      "other:m: &m {x: 1, y: 2}", "other:n: {<<: *m, y: 3}"))
    _, config, _ = load_stack(str(path))
    assert config["other:b"] == ["us-east-1a"] and config["other:n"] == {"x": 1, "y": 3}


def test_alias_inside_itself_exits_2(tmp_path: Path) -> None:
    refused(plan(tmp_path, with_config_lines("other:loop: &loop [a, *loop]")), "other:loop[1]",
            "refers to a value that holds it")


@pytest.mark.parametrize("shape", ["flow-list", "flow-map", "block"])
def test_deep_nesting_exits_2(tmp_path: Path, shape: str) -> None:
    deep = {
        "flow-list": "other:deep: " + "[" * 50_000 + "]" * 50_000,
        "flow-map": "other:deep: " + "{a: " * 5_000 + "1" + "}" * 5_000,
        "block": "other:deep:\n" + "".join("  " * (i + 2) + "a:\n" for i in range(200)) + "  " * 202 + "b",
    }[shape]
    text = with_config_lines(deep)
    refused(plan(tmp_path, text), "other:deep", "nested more than 32 deep")
    assert time_to_refuse(text) < 0.2


@pytest.mark.parametrize(("line", "where"), [
    ("gpucluster:budget: {monthly_limit_usd: %s}", "budget.monthly_limit_usd"),
    ("aws:maxRetries: %s", "aws:maxRetries"),
    ("other:n: [1, 2, %s]", "other:n[2]"),
    ("other:n: -%s.5", "other:n"),
])
def test_integers_too_long_to_convert_exit_2(tmp_path: Path, line: str, where: str) -> None:
    refused(plan(tmp_path, with_config_lines(line % ("9" * 5000))), where, "a number of 500")


def test_duplicate_keys_exit_2_never_last_one_wins(tmp_path: Path) -> None:
    text = DEV.replace("  aws:region: us-east-1\n", "  aws:region: us-east-1\n  aws:region: eu-west-1\n")
    refused(plan(tmp_path, text), "aws:region", "duplicate key 'aws:region' (first on line 5)")
    nested = DEV.replace("      owner: ml-platform", "      owner: ml-platform\n      owner: someone-else")
    refused(plan(tmp_path, nested), "cluster.tags.owner", "duplicate key 'owner'")
    flow = DEV.replace("[us-east-1a, us-east-1b]", "[us-east-1a]\n    availability_zones: [us-east-1b]")
    refused(plan(tmp_path, flow), "network.availability_zones", "duplicate key")


def test_a_key_with_and_without_its_namespace_is_a_duplicate(tmp_path: Path) -> None:
    text = with_config_lines("spot: {interruption_timeout_seconds: 30}")
    refused(plan(tmp_path, text), "gpucluster:spot", "set twice in config")


@pytest.mark.parametrize(("text", "fragment"), [
    ('"\\0"', "NUL characters"),
    ('"\\ud800"', "invalid Unicode"),
    ("\x07bell", "control characters"),
])
def test_text_no_node_can_hold_exits_2(tmp_path: Path, text: str, fragment: str) -> None:
    result = plan(tmp_path, with_config_lines(f"other:t: {text}"))
    refused(result, "other:t" if "NUL" in fragment or "Unicode" in fragment else "(stack file)", fragment)


def test_files_that_are_not_stack_files_exit_2(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.dir.yaml").mkdir()
    assert "not a regular file" in refused(
        runner.invoke(app, ["plan", str(tmp_path / "Pulumi.dir.yaml")]), str(tmp_path), "")
    fifo = tmp_path / "Pulumi.fifo.yaml"
    os.mkfifo(fifo)  # reading it would block for ever
    refused(runner.invoke(app, ["plan", str(fifo)]), str(fifo), "not a regular file")
    big = tmp_path / "Pulumi.big.yaml"
    big.write_text(DEV + "# " + "x" * 300_000 + "\n")
    refused(runner.invoke(app, ["plan", str(big)]), str(big), "larger than 256 KiB")
    latin1 = tmp_path / "Pulumi.latin1.yaml"
    latin1.write_bytes(DEV.replace("ml-platform", "\xe9quipe").encode("latin-1"))
    refused(runner.invoke(app, ["plan", str(latin1)]), str(latin1), "not UTF-8 text")
    long_name = "x" * 300 + ".yaml"
    result = runner.invoke(app, ["plan", str(tmp_path / long_name)])
    assert result.exit_code == 2 and "cannot read it" in result.output


def test_stack_names_are_pulumi_stack_names(tmp_path: Path) -> None:
    """The stack name reaches tags and the user data's first line: Pulumi's characters only."""
    refused(plan(tmp_path, DEV, name="a$(touch x)\nb"), "stack", "1-100 letters, digits")
    assert plan(tmp_path, DEV, name="team_a.dev-2").exit_code == 0


# -------------------------------------------------------- item 7: under `pulumi up`


def engine_config(config: dict[str, Any]) -> dict[str, str]:
    """Config as the engine passes it in PULUMI_CONFIG: strings, JSON for the rest."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}


@pytest.mark.parametrize(("key", "text", "where", "fragment"), [
    ("gpucluster:spot", '{"interruption_command": "a", "interruption_command": "b"}',
     "spot", "duplicate key 'interruption_command'"),
    ("gpucluster:budget", '{"monthly_limit_usd": ' + "9" * 5000 + "}", "budget", "a number of 5000"),
    ("gpucluster:network", "[" * 100_000 + "]" * 100_000, "network", "nested more than 32 deep"),
    ("aws:defaultTags", '{"tags": ' * 40 + "1" + "}" * 40, "aws:defaultTags", "nested more than 32 deep"),
    ("other:x", '["\\u0000"]', "other:x[0]", "NUL characters"),
    ("other:x", '["\\ud800"]', "other:x[0]", "not valid Unicode"),
])
def test_pulumi_config_json_is_bounded_like_the_stack_file(key: str, text: str, where: str,
                                                             fragment: str) -> None:
    config = engine_config(BASE_CONFIG) | {key: text}
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    assert any(f.path.startswith(where) and fragment in f.message for f in err.value.findings), str(err.value)


def test_program_under_pulumi_up_refuses_hostile_config_with_a_short_run_error() -> None:
    """program.run reads PULUMI_CONFIG (read_config_map): RunError, one short line per problem."""
    set_all_config(engine_config(BASE_CONFIG) | {
        "gpucluster:spot": '{"interruption_command": "a", "interruption_command": "b"}',
        "aws:defaultTags": "[" * 100_000 + "]" * 100_000,
        "gpucluster:cluster": json.dumps({"name": "x" * 100_000}),
    })
    with pytest.raises(pulumi.RunError) as err:
        record_resources(program.run, stack="t")
    lines = str(err.value).splitlines()
    assert all(len(line) <= MAX_LINE_CHARS for line in lines), lines
    assert lines[0] == "invalid stack config for t:"
    assert "spot: duplicate key 'interruption_command' in a mapping" in lines
    assert "aws:defaultTags: nested more than 32 deep" in lines
    (name,) = [line for line in lines if line.startswith("cluster.name: ")]
    assert name.endswith("got '" + "x" * SHOWN_CHARS + "…")


def test_python_values_that_are_not_plain_are_findings_not_crashes() -> None:
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    config = dict(BASE_CONFIG) | {"other:cycle": cyclic, "other:object": object(), "other:bytes": b"x",
                                  "other:keys": {1: "x"}, "other:set": {1, 2}, "other:big": 10 ** 5000}
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    paths = {f.path.split("[")[0]: f.message for f in err.value.findings}
    assert paths["other:cycle"] == "nested more than 32 deep"
    assert paths["other:object"].endswith("got object") and paths["other:bytes"].endswith("got bytes")
    assert paths["other:keys"] == "mapping keys must be strings, got 1"
    assert paths["other:set"].endswith("got set") and "more than 100 digits" in paths["other:big"]


# ------------------------------------------------------------- item 8: short messages


@pytest.mark.parametrize(("line", "where"), [
    ("gpucluster:cluster: {name: %s}", "cluster.name"),
    ("gpucluster:autostop: {stop_schedule: 'cron(%s)'}", "autostop.stop_schedule"),
    ("gpucluster:budget: {monthly_limit_usd: 10, emails: [%s]}", "budget.emails[0]"),
    ("gpucluster:network: {availability_zones: [us-east-1a], vpc_cidr: %s}", "network.vpc_cidr"),
    ("gpucluster:cluster: {name: gpu, tags: {owner: o, cost_center: c, environment: %s}}",
     "cluster.tags.environment"),
    ("gpucluster:spot: {interruption_command: %s}", "spot.interruption_command"),
])
def test_values_echoed_in_errors_are_cut(tmp_path: Path, line: str, where: str) -> None:
    huge = "Z" * 200_000
    key, value = (line % huge).split(": ", 1)
    text = "config:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in BASE_CONFIG.items() if k != key)
    hit = refused(plan(tmp_path, f"{text}  {key}: {value}\n"), where, "")
    assert "Z" * (SHOWN_CHARS + 1) not in hit and "…" in hit
    assert len(hit) <= MAX_LINE_CHARS


def test_long_keys_and_huge_numbers_are_cut_too() -> None:
    config = dict(BASE_CONFIG) | {"gpucluster:" + "k" * 100_000: 1}
    config["gpucluster:node_groups"] = [{**BASE_CONFIG["gpucluster:node_groups"][0],
                                         "max_nodes": 10 ** 90, "k" * 50_000: 1}]
    with pytest.raises(SpecError) as err:
        parse_stack_config(config, stack="t")
    lines = str(err.value).splitlines()
    assert len(lines) == 3 and all(len(line) <= MAX_LINE_CHARS for line in lines), lines
    assert "node_groups[0].max_nodes: must be 1..2000, got <a 299-bit number>" in lines, lines
    assert any(line.startswith("node_groups[0].kkkkkkkk") and line.endswith("…") for line in lines)


def test_thousands_of_problems_print_fifty_lines(tmp_path: Path) -> None:
    tags = ", ".join(f"'bad{{{i}}}': x" for i in range(2000))
    result = plan(tmp_path, DEV.replace("    name: gpu-dev\n", "    name: gpu-dev\n"
                                        f"    extra_tags: {{{tags}}}\n"))
    lines = result.output.splitlines()
    assert result.exit_code == 2 and len(lines) == MAX_FINDINGS + 1
    assert lines[-1] == f"…: {2000 - MAX_FINDINGS + 1} more problems not shown; fix the ones above first"


# ----------------------------------------------------------- item 9: hooks and prefixes

HOSTILE_COMMANDS = [
    "echo @@FILES@@ @@LABEL@@ @@",
    "echo start\nGPUCLUSTER_FILE_EOF\ntouch /tmp/gpucluster-pwned\nGPUCLUSTER_FILE_EOF_1\necho end",
    "echo 'single' \"double\" `id` $(touch /tmp/gpucluster-pwned) ${HOME} \\ ; exit 3",
    "printf '%s\\n' \"$GPUCLUSTER_EVENT\"\r\n\techo crlf and tab",
    "echo ünïcødé ✓ \u202e \u2028 done",
]


@pytest.mark.parametrize("command", HOSTILE_COMMANDS,
                         ids=["at-signs", "delimiter", "quotes", "crlf", "unicode"])
def test_hook_commands_reach_lambda_and_user_data_byte_for_byte(command: str) -> None:
    config = dict(BASE_CONFIG) | {
        "gpucluster:autostop": {"pre_stop_command": command},
        "gpucluster:spot": {"interruption_command": command},
    }
    plan_ = plan_config(config)
    env = {r.name: r.inputs["environment"]["variables"]
           for r in plan_.of_type("aws:lambda/function:Function") if r.inputs.get("environment")}
    assert [v["PRE_STOP_COMMAND"] for v in env.values() if "PRE_STOP_COMMAND" in v] == [command]
    assert [v["INTERRUPTION_COMMAND"] for v in env.values() if "INTERRUPTION_COMMAND" in v] == [command]
    (template,) = plan_.of_type("aws:ec2/launchTemplate:LaunchTemplate")
    user_data = gzip.decompress(base64.b64decode(template.inputs["userData"])).decode()
    assert "GPUCLUSTER_INTERRUPTION_COMMAND=" in user_data
    # What the node sources: cut the node.env heredoc out, let bash read it, compare.
    env_file = re.search(r"cat > /etc/gpucluster/node.env <<'(\w+)'\n(.*?)\n\1\n", user_data, re.S)
    assert env_file is not None
    show = 'printf %s "$GPUCLUSTER_INTERRUPTION_COMMAND"'
    stored = subprocess.run(["bash", "-c", f"{env_file.group(2)}\n{show}"], capture_output=True,
                            check=True).stdout
    assert stored == command.encode()
    assert not Path("/tmp/gpucluster-pwned").exists()


@pytest.mark.parametrize("prefix", ["*/", "data/*/", "data?/", "${aws:username}/", "a{b}/", "a$b/",
                                    "data/../", "./", "data//x/", "a:b/"])
@pytest.mark.parametrize("key", ["prefix", "checkpoint_prefix"])
def test_prefixes_iam_would_read_as_patterns_exit_2(tmp_path: Path, key: str, prefix: str) -> None:
    text = DEV.replace(f"      {key}: ", f"      {key}: {json.dumps(prefix)}\n      x_{key}: ", 1)
    text = text.replace(f"      x_{key}: ", "      # ", 1)
    refused(plan(tmp_path, text), f"datasets[0].{key}", "")


# ------------------------------------------------------------------ item 10: mount paths

SYSTEM_DIRS = ["/etc/cron.d", "/usr/local/sbin", "/root/.ssh", "/etc", "/bin", "/var/lib", "/home/ubuntu",
               "/opt/dlami", "/", "/boot", "/proc/sys", "/tmp", "/lib/systemd", "/data/../etc",
               "/mnt/./x", "/scratch/..", "//etc", "/datasets", "/scratch2", "/fsx/a b", "relative/x",
               "/mnt/" + "x" * 300]
MOUNT_KEYS = {
    "scratch_mount": ("      scratch_mount: /scratch", "      scratch_mount: %s",
                      "node_groups[0].scratch_mount"),
    "mount_path": ("      access: mount", "      access: mount\n      mount_path: %s",
                   "datasets[0].mount_path"),
}


@pytest.mark.parametrize("path", SYSTEM_DIRS)
@pytest.mark.parametrize("key", MOUNT_KEYS)
def test_mount_paths_outside_the_data_roots_exit_2(tmp_path: Path, key: str, path: str) -> None:
    old, new, where = MOUNT_KEYS[key]
    line = refused(plan(tmp_path, DEV.replace(old, new % json.dumps(path), 1)), where, "")
    assert "/data, /fsx, /scratch, /mnt" in line or "plain absolute path" in line


@pytest.mark.parametrize("path", ["/etc/cron.d", "/root/.ssh", "/fsx/../etc"])
def test_fsx_mount_path_outside_the_data_roots_exits_2(tmp_path: Path, path: str) -> None:
    prod = (REPO / "stacks" / "Pulumi.prod.yaml").read_text()
    refused(plan(tmp_path, prod.replace("mount_path: /fsx", f"mount_path: {path}")),
            "datasets[0].fsx.mount_path", "")


@pytest.mark.parametrize("path", ["/data/x", "/mnt/nvme", "/fsx/team-a", "/scratch/", "/data"])
def test_mount_paths_under_the_data_roots_are_accepted(path: str) -> None:
    config = dict(BASE_CONFIG) | {"gpucluster:datasets": [{"name": "dd", "mount_path": path}]}
    config["gpucluster:node_groups"] = [{**BASE_CONFIG["gpucluster:node_groups"][0],
                                         "scratch_mount": "/mnt/scratch" if path.startswith("/scratch")
                                         else "/scratch"}]
    assert parse_stack_config(config, stack="t").datasets[0].mount_path == path


def test_without_libyaml_the_pure_python_parser_keeps_the_same_bounds() -> None:
    """PyYAML built without libyaml: the loader falls back to its Python parser, same answers."""
    probe = """
import sys
sys.modules["yaml.cyaml"] = None  # as if PyYAML had no libyaml
from gpucluster import stackfile
from gpucluster.spec import SpecError
assert stackfile._Parser.__module__ == "gpucluster.stackfile"
for text in ["a: !!binary x", "a: &a [*a]", "a: 1\\na: 2", "a: " + "[" * 100000, "a: \\x01",
             "a: 9" + "9" * 5000]:
    try:
        stackfile.load_yaml(text)
        print("accepted", text[:20])
    except SpecError as err:
        print(err)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         timeout=60).stdout.splitlines()
    wheres = [line.split(": ", 1)[0] for line in out]
    assert wheres == ["a", "a[0]", "a", "a" + "[0]" * 31, "(stack file)", "a"]
    assert "is not allowed" in out[0] and "duplicate key 'a'" in out[2] and "nested more than 32" in out[3]
    assert "special characters" in out[4] and "a number of 5001 characters" in out[5]
