"""Fuzzing the stack-file path: mutated shipped stacks never crash, hang or flood.

330 cases from a fixed seed: the three shipped stacks, each mutated by one of the
operators below (type swaps, deletions, huge values, deep nesting, unicode, YAML
tags, aliases and alias bombs, duplicate keys, broken text). Every case goes
through `load_stack`, the function `gpucluster plan` validates with, and, when
its YAML reads, through `parse_stack_config` as `pulumi up` hands config over
(strings and JSON). A sample also runs through the CLI itself. The whole test
takes a few seconds; a case that needs more than CASE_SECONDS fails it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import gc
import json
import random
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpucluster import project
from gpucluster.cli import app
from gpucluster.plan import StackFileError, load_stack, read_stack_config
from gpucluster.preflight import parse_stack_config
from gpucluster.spec import MAX_FINDINGS, MAX_LINE_CHARS, SpecError
from gpucluster.stackfile import load_yaml

SEED = 12_0007
CASES = 330
CASE_SECONDS = 2.0
"""CPU seconds. Measured on 2 cores: median 1.5 ms a case, the slowest (10,000 values, the
bound) 0.09 s, 0.9 s for all 330; before the bounded loader an alias bomb ran for minutes."""
CLI_SAMPLE = 20
STACKS = {name: (Path(__file__).resolve().parent.parent / "stacks" / f"Pulumi.{name}.yaml").read_text()
          for name in ("dev", "staging", "prod")}

DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
Tree = Any
Path_ = tuple[str | int, ...]

UNICODE = ["\u202eevil", "💥🔥", "e\u0301", "\u2028line", "\ufeffbom", "\uff46\uff55\uff4c\uff4c", "İı",
           "\u0085nel", "\t tab", "a\u200bb", "ß" * 30, "日本語のテキスト", "\x7fdel"]
SWAPS: list[Any] = [0, -1, 1.5, 1e308, float("inf"), float("nan"), True, False, None, "", "x", "on", [],
                    {}, ["a"], {"k": "v"}, [[]], "0x1F", "1_000", "2024-01-01", "12:30:00", "~"]
TAGS = ["!!binary aGk=", "!!set {a}", "!!omap [a: 1]", "!!python/tuple [1]", "!custom x", "!!int nope",
        "!!str 5", "!!float 1.5", "!!timestamp 2024-01-01", "!<tag:x.org,2024:y> z", "!!pairs [a: 1]"]


def paths(tree: Tree, at: Path_ = ()) -> list[Path_]:
    """Every position in a tree of plain values, the root excluded."""
    found: list[Path_] = []
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else []
    for key, value in items:
        found.append((*at, key))
        found.extend(paths(value, (*at, key)))
    return found


def parent_of(tree: Tree, where: Path_) -> Any:
    for part in where[:-1]:
        tree = tree[part]
    return tree


@functools.cache
def parsed(text: str) -> Tree:
    """A stack file's text, read once: most tree operators start from one of the three shipped stacks."""
    return load_yaml(text)


def tree_op(change: Callable[[random.Random, Any, str | int], None]) -> Callable[[random.Random, str], str]:
    """An operator on the parsed stack: pick a position, change it there, write YAML again."""

    def apply(rng: random.Random, text: str) -> str:
        tree = copy.deepcopy(parsed(text))
        where = rng.choice(paths(tree["config"]))
        change(rng, parent_of(tree["config"], where), where[-1])
        return yaml.dump(tree, Dumper=DUMPER, sort_keys=False, allow_unicode=True, width=200)

    return apply


def _swap(rng: random.Random, parent: Any, key: str | int) -> None:
    parent[key] = rng.choice(SWAPS)


def _delete(rng: random.Random, parent: Any, key: str | int) -> None:
    del parent[key]


def _huge(rng: random.Random, parent: Any, key: str | int) -> None:
    parent[key] = rng.choice(["x" * rng.choice([300, 5_000, 120_000]),
                              list(range(rng.choice([2_000, 12_000]))),  # 12,000: past MAX_VALUES
                              10 ** 80, -(10 ** 99), 1e308, {f"k{i}": i for i in range(1_500)}])


def _nest(rng: random.Random, parent: Any, key: str | int) -> None:
    value = parent[key]
    for _ in range(rng.choice([10, 33, 60])):
        value = [value] if rng.random() < 0.5 else {"n": value}
    parent[key] = value


def _unicode(rng: random.Random, parent: Any, key: str | int) -> None:
    value = rng.choice(UNICODE)
    if isinstance(parent, dict) and rng.random() < 0.5:
        parent[value] = parent.pop(key)  # a key, not a value
    else:
        parent[key] = value if rng.random() < 0.5 else f"{parent[key]}{value}"


def _extra(rng: random.Random, parent: Any, key: str | int) -> None:
    target = parent if isinstance(parent, dict) else parent[key] if isinstance(parent[key], dict) else None
    if target is None:
        parent[key] = [parent[key], parent[key]]  # a list item twice (duplicate names and so on)
        return
    name = rng.choice(["nmae", "gpucluster:x", "aws:region", "k" * 500, "a b", "", "<<", "1", "null"])
    target[name] = rng.choice(SWAPS)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _value_lines(text: str) -> list[int]:
    return [i for i, line in enumerate(_lines(text)) if ": " in line and not line.lstrip().startswith("#")]


def _tag(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i = rng.choice(_value_lines(text))
    head, _, _ = lines[i].partition(": ")
    lines[i] = f"{head}: {rng.choice(TAGS)}\n"
    return "".join(lines)


def _bomb(rng: random.Random, text: str) -> str:
    """Billion laughs: 9 aliases a level; 3 levels stay small, 5 or 9 expand past any bound."""
    bomb = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, rng.choice([3, 5, 9])):
        bomb.append(f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join([f'*{chr(96 + i)}'] * 9)}]")
    if rng.random() < 0.5:
        return text.replace("config:\n", "config:\n" + "".join(f"  bomb:{line}\n" for line in bomb), 1)
    return "x-anchors:\n" + "".join(f"  {line}\n" for line in bomb) + text


def _anchor(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    first, second = sorted(rng.sample(_value_lines(text), 2))
    head, _, value = lines[first].partition(": ")
    lines[first] = f"{head}: &x {value}"
    head2, _, _ = lines[second].partition(": ")
    lines[second] = f"{head2}: *{'x' if rng.random() < 0.8 else 'nope'}\n"
    if rng.random() < 0.3:  # an alias inside its own anchor
        lines.insert(first + 1, " " * (len(head) - len(head.lstrip()) + 2) + "- *x\n")
    return "".join(lines)


def _duplicate(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i = rng.choice(_value_lines(text))
    lines.insert(i + 1, lines[i])
    return "".join(lines)


def _long_number(rng: random.Random, text: str) -> str:
    lines = _lines(text)
    i = rng.choice(_value_lines(text))
    head, _, _ = lines[i].partition(": ")
    lines[i] = f"{head}: {rng.choice(['', '-', '0x'])}{'9' * rng.choice([50, 101, 4_301, 20_000])}\n"
    return "".join(lines)


def _deep_text(rng: random.Random, text: str) -> str:
    n = rng.choice([31, 40, 1_000, 100_000])
    value = rng.choice(["[" * n + "]" * n, "{a: " * n + "1" + "}" * n])
    key = rng.choice(["aws:x", "gpucluster:spot", "x"])
    return text.replace("config:\n", f"config:\n  {key}: {value}\n", 1)


def _truncate(rng: random.Random, text: str) -> str:
    return text[:rng.randrange(len(text))]


def _noise(rng: random.Random, text: str) -> str:
    chars = list(text)
    for _ in range(rng.choice([1, 3, 10])):
        chars.insert(rng.randrange(len(chars)), rng.choice(["\x00", "\x07", "\t", "\ud800", "'", '"', "{",
                                                            "[", "&", "*", "!", "%", "@", "`", "|", ">",
                                                            "\r", "\x85", "\ufeff", ":"]))
    return "".join(chars)


OPERATORS: dict[str, Callable[[random.Random, str], str]] = {
    "type-swap": tree_op(_swap), "delete": tree_op(_delete), "huge-value": tree_op(_huge),
    "deep-nesting": tree_op(_nest), "unicode": tree_op(_unicode), "extra-key": tree_op(_extra),
    "tag": _tag, "alias-bomb": _bomb, "anchor": _anchor, "duplicate-key": _duplicate,
    "long-number": _long_number, "deep-text": _deep_text, "truncate": _truncate, "noise": _noise,
}


@dataclass
class Case:
    name: str
    data: bytes


def cases() -> list[Case]:
    """CASES mutated stack files, the same ones on every run (fixed seed)."""
    rng = random.Random(SEED)
    out = []
    operators = list(OPERATORS.items())
    for i in range(CASES):
        stack = list(STACKS)[i % len(STACKS)]
        op_name, op = operators[i % len(operators)]
        text = op(rng, STACKS[stack])
        if rng.random() < 0.15:  # now and then two mutations at once
            second_name, second = rng.choice(operators)
            # (unless the first mutation left nothing the second can work on)
            with contextlib.suppress(SpecError, KeyError, TypeError, ValueError, IndexError):
                text, op_name = second(rng, text), f"{op_name}+{second_name}"
        out.append(Case(f"{i:03d}-{stack}-{op_name}", text.encode("utf-8", "surrogatepass")))
    return out


def check_output(text: str) -> None:
    lines = text.splitlines()
    assert len(lines) <= MAX_FINDINGS + 1 and all(len(line) <= MAX_LINE_CHARS for line in lines), text[:2000]


def engine_config(config: dict[str, Any]) -> dict[str, str]:
    """As `pulumi up` hands config to the program: strings, JSON for the rest."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()}


@contextlib.contextmanager
def configs_read() -> Iterator[list[dict[str, Any]]]:
    """A copy of each config map `read_stack_config` returns meanwhile (`load_stack` reads through it):
    the `pulumi up` path of a case then starts from the map load_stack read, not from a second read
    and parse of the same file (a third of the cases' time)."""
    read: list[dict[str, Any]] = []

    def recorded(path: Path) -> dict[str, Any]:
        config = read_stack_config(path)
        read.append(copy.deepcopy(config))  # as read, whatever validation does with it later
        return config

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(project, "read_stack_config", recorded)
        yield read


def validate(path: Path) -> str:
    """One case as the CLI validates it, plus the `pulumi up` path; the verdict (or raises)."""
    with configs_read() as read:
        try:
            load_stack(str(path))
            verdict = "valid"
        except SpecError as err:
            check_output(str(err))
            verdict = "invalid"
        except StackFileError as err:
            check_output(str(err))
            return "unreadable"
    if not read:  # the file's YAML is not a plain, bounded stack file (SpecError while reading)
        return verdict
    (config,) = read
    try:
        parse_stack_config(engine_config(config), stack="t")
    except SpecError as err:
        check_output(str(err))
    return verdict


@dataclass
class Outcome:
    verdict: str
    seconds: float
    crash: str | None = None


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Outcome]]:
    """Every case written to a file and validated once, timed; a crash is kept, not raised."""
    root = tmp_path_factory.mktemp("fuzz")
    out = {}
    # Timed in CPU seconds of this thread, with the collector paused: other processes on a
    # busy machine and a full collection of the rest of the suite's objects are not the input's
    # doing, while a hang or a bomb still burns seconds of CPU here.
    collecting = gc.isenabled()  # the suite runs with the collector off (conftest.py): leave it so
    gc.disable()
    try:
        for case in cases():
            path = root / f"Pulumi.{case.name}.yaml"
            path.write_bytes(case.data)
            started = time.thread_time()
            try:
                verdict, crash = validate(path), None
            except Exception as exc:  # the point of the test: nothing else may escape
                verdict, crash = "crash", (f"{case.name}: {type(exc).__name__}: {str(exc)[:200]}\n"
                                           + "".join(traceback.format_tb(exc.__traceback__)[-3:]))
            out[case.name] = (path, Outcome(verdict, time.thread_time() - started, crash))
    finally:
        if collecting:
            gc.enable()
    return out


def test_fuzzed_stack_files_never_crash_hang_or_flood(outcomes: dict[str, tuple[Path, Outcome]]) -> None:
    results = {name: outcome for name, (_, outcome) in outcomes.items()}
    crashes = [o.crash for o in results.values() if o.crash]
    assert crashes == [], f"{len(crashes)} tracebacks:\n" + "\n".join(crashes[:5])
    slowest = max(results, key=lambda name: results[name].seconds)
    assert results[slowest].seconds < CASE_SECONDS, f"{slowest} took {results[slowest].seconds:.2f} s"
    assert len(results) >= 300
    verdicts = [o.verdict for o in results.values()]
    counts = {v: verdicts.count(v) for v in ("valid", "invalid", "unreadable")}
    # Every operator is exercised, and the mix is not all one verdict.
    assert {name.split("-", 2)[2].split("+")[0] for name in results} == set(OPERATORS)
    assert counts["valid"] >= 10 and counts["invalid"] >= 150, counts


def test_a_sample_through_the_cli_exits_0_1_or_2_without_traceback(
        outcomes: dict[str, tuple[Path, Outcome]]) -> None:
    runner = CliRunner()
    rng = random.Random(SEED)
    # Mostly cases that stop at validation (milliseconds); two valid ones run the whole plan (~1 s).
    valid = sorted(name for name, (_, o) in outcomes.items() if o.verdict == "valid")
    rest = sorted(name for name, (_, o) in outcomes.items() if o.verdict != "valid")
    seen_exit: set[int] = set()
    for name in rng.sample(valid, 2) + rng.sample(rest, CLI_SAMPLE - 2):
        path, outcome = outcomes[name]
        started = time.perf_counter()
        result = runner.invoke(app, ["plan", str(path)])
        elapsed = time.perf_counter() - started
        assert result.exit_code in (0, 1, 2), f"{name}: exit {result.exit_code}\n{result.output[-2000:]}"
        assert result.exception is None or isinstance(result.exception, SystemExit), (name, result.exception)
        assert "Traceback" not in result.output, name
        # A whole plan takes ~1 s (more on a loaded machine); a hang or a bomb takes minutes.
        assert len(result.output) < 64_000 and elapsed < 30, (name, len(result.output), elapsed)
        assert (result.exit_code == 2) == (outcome.verdict != "valid"), (name, outcome.verdict)
        if result.exit_code == 2:
            check_output(result.output)
        seen_exit.add(result.exit_code)
    assert 2 in seen_exit and seen_exit & {0, 1}, seen_exit
