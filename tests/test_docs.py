"""The docs tell the truth: generated references match the code, commands run, the README stays short.

The README is the front page (under 200 lines); the site is docs/ (mkdocs.yml, built with
`mkdocs build --strict` in .ci/run). Every shell command in the README and on the getting-started
page either runs here (in a scratch copy of the project, with the venv activated the way the page
says) or is marked `# needs AWS` / `# needs the Pulumi CLI`, and then its syntax (`bash -n`) and,
for `gpucluster`, its command and options are checked against the typer app. The quick start's
install commands are not run here: .ci/run runs them verbatim (checked below).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from gpucluster.cli.entry import app
from gpucluster.reference import BEGIN, END, PAGES, render_config_reference
from gpucluster.spec import StackConfig

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = (REPO / "README.md").read_text()
GETTING_STARTED = (DOCS / "getting-started.md").read_text()
NEEDS = re.compile(r"#\s*needs (AWS|the Pulumi CLI)\b")
QUICK_START_GUARD = "python3 -c \"import sys; sys.exit(sys.version_info < (3, 11)"


def ci_command(marker: str) -> str:
    """The command .ci/run runs between `$(cat <<'MARKER'` and `MARKER`."""
    ci = (REPO / ".ci" / "run").read_text()
    return ci.split(f"=$(cat <<'{marker}'\n", 1)[1].split(f"\n{marker}\n)", 1)[0]


def shell_lines(markdown: str) -> list[str]:
    """Every command line of the page's ```bash blocks, continuation lines joined."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, re.DOTALL):
        lines += [line.strip() for line in re.sub(r"\\\n\s*", " ", block).splitlines() if line.strip()]
    return lines


def runnable(markdown: str) -> list[str]:
    """The lines a test runs: not marked as needing AWS or the Pulumi CLI, not the quick start's installs."""
    return [line for line in shell_lines(markdown)
            if not NEEDS.search(line) and not line.startswith(QUICK_START_GUARD)]


# ----------------------------------------------------------------------------------- the front page


def test_the_readme_is_a_front_page_under_200_lines() -> None:
    assert README.count("\n") < 200
    for page in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (REPO / page).is_file(), page


def test_ci_runs_the_readme_test_command() -> None:
    command = ci_command("README")
    assert "\n" not in command and command.endswith("python -m pytest")
    assert f"```bash\n{command}\n```" in README
    assert f"```bash\n{command}\n```" in joined((DOCS / "development.md").read_text())


def test_ci_runs_the_quick_start_command_and_the_getting_started_page_shows_it() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    first = quick.split("```bash\n", 1)[1].split("\n", 1)[0]
    assert first == ci_command("QUICK_START")
    install = GETTING_STARTED.split("## 1. Install", 1)[1].split("\n## ", 1)[0]
    assert f"```bash\n{first}\n```" in joined(install)


def test_readme_has_exactly_two_quick_start_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [block.split("\n")[1] for block in quick.split("```bash")[1:]]
    assert len(commands) == 2
    assert commands[0].endswith("gpucluster plan dev")
    assert commands[1].endswith("python -m pytest")


@pytest.mark.parametrize("page", ["README.md", *sorted(str(p.relative_to(REPO)) for p in DOCS.rglob("*.md"))])
def test_shell_commands_work_in_zsh_too(page: str) -> None:
    """zsh expands an unquoted `.[chart]` (or any `[`, `*`, `?`) as a glob and stops ("no matches
    found"): extras and patterns are quoted, in the command blocks and in the text alike."""
    text = (REPO / page).read_text()
    assert not re.search(r"(?<![\"'])\.\[\w+\]", text)
    for line in shell_lines(text):
        bare = re.sub(r"'[^']*'|\"[^\"]*\"", "", line.split(" #", 1)[0])
        assert not re.search(r"[\[\]*?]", bare), line


def test_the_chart_extra_is_quoted_where_the_cost_command_is_explained() -> None:
    assert "pip install -e '.[chart]'" in (DOCS / "guides" / "cli.md").read_text()


def test_an_older_python_stops_at_the_first_step_with_one_line() -> None:
    guard = README.split("## Quick start", 1)[1].split("```bash\n", 1)[1].split(" && ", 1)[0]
    assert guard.startswith("python3 -c ")
    older = _an_older_python()
    if older is None:
        pytest.skip("no Python older than 3.11 on this machine")
    done = subprocess.run(["bash", "-c", guard.replace("python3", older, 1)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert re.fullmatch(r"gpucluster needs Python 3\.11 or newer, not 3\.\d+\.\d+\n", done.stderr)
    assert subprocess.run(["bash", "-c", guard.replace("python3", sys.executable, 1)],
                          check=False).returncode == 0


def _an_older_python() -> str | None:
    """A Python 3.8-3.10 that runs here (PATH, or pyenv's installs), else None."""
    candidates = sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.*/bin/python"))
    candidates += [shutil.which(f"python3.{minor}") for minor in (10, 9, 8)]
    for candidate in (c for c in candidates if c and "/shims/" not in c):  # pyenv's shims are slow
        probe = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2] < (3, 11))"],
                               capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            return candidate
    return None


# ------------------------------------------------------------------------------ commands that run


def scratch_project(tmp_path: Path) -> Path:
    """This repository's project files in `tmp_path`, with `.venv` the venv running the tests.

    `bin/` of that venv is taken off PATH, so bare `gpucluster` works only once the page's own
    `source .venv/bin/activate` has run.
    """
    for name in ("Pulumi.yaml", "__main__.py"):
        shutil.copy(REPO / name, tmp_path / name)
    for name in ("stacks", "policies"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    return tmp_path


def run_page(lines: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    venv_bin = str(Path(sys.prefix) / "bin")
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p.rstrip("/") != venv_bin)
    env = {**os.environ, "PATH": path, "NO_COLOR": "1"}
    env.pop("VIRTUAL_ENV", None)
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True,
                          check=False, timeout=300)


SHELL_ONLY = {";", "||", "&", ">", "<", ">>", "|&", "(", ")"}
PLAIN_WORD = re.compile(r"[\w./=:,@%+-]+")
"""A word bash passes on as it is (nothing to expand, quote or glob): `rm -rf demo`."""


def steps_of(line: str) -> list[list[str]] | None:
    """The `&&`-separated commands of a line as words, when every one is `cd DIR`, the activation, a
    `gpucluster` command (piped at most once) or another command of plain words (bash runs that one);
    None for any other shape (bash runs the whole line)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    steps: list[list[str]] = [[]]
    for token in lexer:
        if token == "&&":
            steps.append([])
        else:
            steps[-1].append(token)
    for step in steps:
        if (not step or set(step) & SHELL_ONLY or (step[0] == "cd" and len(step) != 2)
                or (step[0] != "gpucluster" and "|" in step) or step.count("|") > 1
                or (step[0] not in ("cd", "gpucluster", "source")
                    and not all(map(PLAIN_WORD.fullmatch, step)))
                or (step[0] == "source" and step != ["source", ".venv/bin/activate"])):
            return None
    return steps


def run_lines(lines: list[str], cwd: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The page's lines as `set -euo pipefail` runs them, each `gpucluster` command in this process.

    A fresh interpreter per documented command cost the suite seconds of CPU for what typer's
    CliRunner shows the same way (arguments, exit code, output). The process is kept where it is
    the point: the activation runs in bash with the venv hidden from PATH and must make bare
    `gpucluster --version` work there (the installed entry point); what a `gpucluster` command's
    output is piped into runs in bash on that output, and so does another command of an `&&` chain
    (`rm -rf demo`), in the venv once the page activated it; a line of another shape (`steps_of`)
    runs in bash as a whole. Returns what the page prints on stdout.
    """
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("NO_COLOR", "1")
    printed = []
    activation: list[str] = []  # once the page activated the venv, bash lines run in it too
    for line in lines:
        steps = steps_of(line)
        if steps is None:
            done = run_page([*activation, line], Path.cwd())
            assert done.returncode == 0, (line, done.stderr[-3000:])
            printed.append(done.stdout)
            continue
        for step in steps:
            if step[0] == "source":
                done = run_page([shlex.join(step), "gpucluster --version"], Path.cwd())
                assert done.returncode == 0 and done.stdout.strip(), (line, done.stderr[-3000:])
                activation = [shlex.join(["source", str(Path.cwd() / step[1])])]
            elif step[0] == "cd":
                os.chdir(step[1])
            elif step[0] == "gpucluster":
                printed.append(run_gpucluster(line, step))
            else:
                done = run_page([*activation, shlex.join(step)], Path.cwd())
                assert done.returncode == 0, (line, done.stderr[-3000:])
                printed.append(done.stdout)
    return "".join(printed)


def run_gpucluster(line: str, step: list[str]) -> str:
    """One `gpucluster ...` command (CliRunner), its stdout piped into the rest of `step` if any."""
    pipe = step.index("|") if "|" in step else len(step)
    result = CliRunner().invoke(app, step[1:pipe])
    assert result.exit_code == 0, (line, result.output[-3000:], result.exception)
    if pipe == len(step):
        return result.stdout
    done = subprocess.run(["bash", "-c", "set -euo pipefail\n" + shlex.join(step[pipe + 1:])],
                          input=result.stdout, capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, (line, done.stderr[-3000:])
    return done.stdout


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_every_unmarked_command_runs(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     cli_plans_once: None) -> None:
    lines = runnable((REPO / page).read_text())
    assert lines[0] == "source .venv/bin/activate", "the page activates the venv before bare `gpucluster`"
    assert any(line.startswith("gpucluster init ") for line in lines)
    assert sum(line.startswith("gpucluster plan ") for line in lines) >= 2
    stdout = run_lines(lines, scratch_project(tmp_path), monkeypatch)
    assert "no violations" in stdout or '"violations": []' in stdout or "[]" in stdout


def test_a_failing_page_command_fails_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, in bash, and in what a command is piped into: a failure is not swallowed."""
    assert steps_of("gpucluster init demo && cd demo") == [["gpucluster", "init", "demo"], ["cd", "demo"]]
    assert steps_of("gpucluster plan dev > out.txt") is None
    assert steps_of("cd .. && rm -rf demo") == [["cd", ".."], ["rm", "-rf", "demo"]]
    assert steps_of("rm -rf demo*") is None and steps_of("echo $HOME") is None  # bash expands those
    for n, line in enumerate(("gpucluster plan nosuch", "false; true", "gpucluster --version | grep -q no",
                              "gpucluster --version && false")):
        (tmp_path / str(n)).mkdir()
        with pytest.raises(AssertionError):
            run_lines([line], scratch_project(tmp_path / str(n)), monkeypatch)


def test_without_the_activation_bare_gpucluster_is_not_found(tmp_path: Path) -> None:
    """The scratch environment really hides the venv: the pages' activation is what makes it work."""
    done = run_page(["gpucluster --version"], scratch_project(tmp_path))
    assert done.returncode == 127


def _command(words: list[str]) -> tuple[str, Any, list[str]]:
    """(`gpucluster cmd [sub]`, its typer command, the words after it) for a gpucluster command line."""
    root = typer.main.get_command(app)
    rest = words[1:]
    while rest and rest[0].startswith("--stacks-dir"):
        rest = rest[1:] if "=" in rest[0] else rest[2:]
    if rest and rest[0] == "--version":
        return "gpucluster", root, rest
    assert rest and rest[0] in root.commands, f"no command {rest[:1]}"
    command, name, rest = root.commands[rest[0]], f"gpucluster {rest[0]}", rest[1:]
    if getattr(command, "commands", None):
        assert rest and rest[0] in command.commands, f"no command {name} {rest[:1]}"
        command, name, rest = command.commands[rest[0]], f"{name} {rest[0]}", rest[1:]
    return name, command, rest


def unknown_options(line: str) -> list[str]:
    """The options of a `gpucluster ...` line its command does not take (before a `--`)."""
    words = shlex.split(line, comments=True)
    name, command, rest = _command(words)
    known = {"--help"} | {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
    options = []
    for word in rest:
        if word == "--":
            break
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
            options.append(word.split("=", 1)[0])
    return [f"{name} {o}" for o in options if o not in known]


def doc_pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", doc_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_gpucluster_command_in_the_docs_has_its_options(page: Path) -> None:
    for line in shell_lines(page.read_text()):
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line.split(" #", 1)[0]):
            if part.startswith("gpucluster "):
                assert unknown_options(part) == [], (page.name, line)


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_commands_marked_as_needing_aws_or_pulumi_parse(page: str) -> None:
    marked = [line for line in shell_lines((REPO / page).read_text()) if NEEDS.search(line)]
    assert marked, "the page shows the deploy"
    for line in marked:
        done = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True, check=False)
        assert done.returncode == 0, (line, done.stderr)
        program = shlex.split(line, comments=True)[0]
        assert program in {"gpucluster", "pulumi", "aws"}, line
        if program == "pulumi":
            assert "needs the Pulumi CLI" in line, line
        if program == "aws":
            assert "needs AWS" in line, line


def test_the_option_check_catches_a_wrong_option_and_command() -> None:
    assert unknown_options("gpucluster plan dev --tree --json") == []
    assert unknown_options("gpucluster run prod --group g --detach -- torchrun --nnodes=2") == []
    assert unknown_options("gpucluster capacity search --type p5.48xlarge --count 4") == []
    assert unknown_options("gpucluster plan dev --trees") == ["gpucluster plan --trees"]
    with pytest.raises(AssertionError, match="no command"):
        unknown_options("gpucluster plna dev")


# ----------------------------------------------------------------------------- generated references


@pytest.mark.parametrize("name", sorted(PAGES))
def test_generated_reference_pages_match_the_code(name: str) -> None:
    assert (DOCS / "reference" / name).read_text() == PAGES[name](), (
        f"docs/reference/{name} is stale: regenerate with `python -m gpucluster.reference --write`")


def test_the_config_page_embeds_the_config_reference() -> None:
    page = (DOCS / "reference" / "config.md").read_text()
    assert page[page.index(BEGIN):page.index(END) + len(END)] == render_config_reference()


def test_every_config_field_is_documented() -> None:
    reference = render_config_reference()
    assert "|  |" not in reference, "a config field has no docstring"
    for name in StackConfig.model_fields:
        assert f"`gpucluster:{name}`" in reference


def test_every_command_option_and_rule_is_in_its_reference() -> None:
    from gpucluster import conformance
    from gpucluster.policy.rules import RULES

    cli = (DOCS / "reference" / "cli.md").read_text()
    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        for sub_name, sub in (getattr(command, "commands", None) or {name: command}).items():
            path = f"gpucluster {name}" + (f" {sub_name}" if sub is not command else "")
            section = cli.split(f"## `{path}`\n", 1)[1].split("\n## ", 1)[0]
            for param in sub.params:
                shown = param.opts[0] if param.param_type_name == "option" else param.name.upper()
                assert f"`{shown}" in section, (path, shown)
    policies = (DOCS / "reference" / "policies.md").read_text()
    assert f"## `{conformance.POLICY}`" in policies
    for rule in RULES:
        assert f"## `{rule.name}`" in policies
        for key in rule.schema:
            assert f"| `{key}` |" in policies.split(f"## `{rule.name}`", 1)[1].split("\n## ", 1)[0]


# ------------------------------------------------------------------------------------ the site


def nav_pages(nav: Any) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [p for v in nav.values() for p in nav_pages(v)]
    return [p for v in nav for p in nav_pages(v)]


MKDOCS = yaml.safe_load((REPO / "mkdocs.yml").read_text())


def test_every_page_is_in_the_nav_on_purpose() -> None:
    """Each page under docs/ is named in mkdocs.yml's nav, by a person, at its place: no hook adds
    the ones it forgets (the old docs/hooks/nav.py appended them under Guides, after internal notes)."""
    named = nav_pages(MKDOCS["nav"])
    assert len(named) == len(set(named))
    for page in named:
        assert (DOCS / page).is_file(), page
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages - set(named) == set(), "pages the nav does not name: add each to mkdocs.yml's nav"
    assert "hooks" not in MKDOCS, "a hook that edits the nav places pages nobody chose a place for"
    assert MKDOCS["validation"]["omitted_files"] == "warn" and MKDOCS["strict"] is True  # --strict fails
    for must in ("getting-started.md", "guides/multi-node-training.md", "guides/capacity-blocks.md",
                 "guides/datasets.md", "guides/guardrails.md", "guides/cost-and-spend.md",
                 "guides/ci-and-policies.md", "guides/security.md", "guides/component-package.md",
                 "reference/cli.md", "reference/config.md", "reference/policies.md", "reference/ledger.md",
                 "releases.md"):
        assert must in named, must


def test_the_nav_leads_with_what_people_came_for() -> None:
    """Getting started, then the schedulers (Slurm, Kubernetes once it has a guide), then the metrics."""
    titles = [next(iter(entry)) for entry in MKDOCS["nav"]]
    assert titles[:3] == ["Home", "Getting started", "Slurm"]
    after = titles[3:]
    if (DOCS / "guides" / "kubernetes.md").is_file():
        assert after[0] == "Kubernetes", after
        after = after[1:]
    assert after[0] == "Prometheus and Grafana", titles
    slurm = nav_pages(MKDOCS["nav"][2])
    assert slurm[0] == "guides/slurm.md"
    assert nav_pages(MKDOCS["nav"][3 + (titles[3] == "Kubernetes")]) == ["guides/prometheus-grafana.md"]


def test_nav_titles_are_plain_text() -> None:
    def titles(nav: Any) -> list[str]:
        if isinstance(nav, dict):
            return [t for k, v in nav.items() for t in [k, *titles(v)]]
        return [t for v in nav for t in titles(v)] if isinstance(nav, list) else []

    for title in titles(MKDOCS["nav"]):
        assert not re.search(r"[`*_<>\[\]]", title), title


def test_no_internal_notes_on_the_site() -> None:
    """Pages written as notes of an issue ("issue 25, items 1, 2...") are folded into the guides."""
    for page in DOCS.rglob("*.md"):
        text = page.read_text()
        assert not re.search(r"\(issue \d+, items?\b|^What changed for", text, re.MULTILINE), page


def test_the_home_page_leads_to_every_guide() -> None:
    """"Where to go" links every page of the nav but Home and the references' own pages."""
    home = (DOCS / "index.md").read_text()
    where = home.split("## Where to go", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\]\(([^)#]+)", where))
    for page in nav_pages(MKDOCS["nav"]):
        if page != "index.md":
            assert page in linked, f"index.md's Where to go does not link {page}"


def test_a_page_the_nav_does_not_name_fails_the_strict_build(tmp_path: Path) -> None:
    """What makes the nav test's promise hold in CI: `mkdocs build --strict` refuses an omitted page."""
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    (tmp_path / "docs" / "index.md").write_text("# Home\n")
    (tmp_path / "docs" / "guides" / "forgotten.md").write_text("# Forgotten\n")
    config = {key: MKDOCS[key] for key in ("strict", "validation", "markdown_extensions")}
    nav = [{"Home": "index.md"}]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump({"site_name": "t", **config, "nav": nav}))
    build = ["mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    done = subprocess.run([sys.executable, "-m", *build], cwd=tmp_path, capture_output=True, text=True,
                          check=False, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode != 0 and "guides/forgotten.md" in done.stdout + done.stderr
    # .ci/run builds the same way: with --quiet, MkDocs 1.6 drops the warnings --strict counts and passes
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    ci_build = next(line for line in ci if "mkdocs build" in line)
    assert " ".join(build[:3]) in ci_build and "--quiet" not in ci_build and "-q " not in ci_build


# Code lines on the site wrap at this width: a longer line is clipped in the browser's code block.
CODE_WIDTH = 100


def code_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```\w*\n(.*?)^```", markdown, re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
                                        if p.parent.name != "reference"))
def test_code_blocks_on_the_site_fit_without_clipping(page: str) -> None:
    """Long commands are wrapped (`\\` continuation lines), long comments go above the command."""
    for block in code_blocks((DOCS / page).read_text()):
        for line in block.splitlines():
            assert len(line) <= CODE_WIDTH, f"{page}: {len(line)} columns: {line[:60]}..."


def joined(markdown: str) -> str:
    """The page with each bash block's continuation lines joined (as a shell reads them)."""
    return re.sub(r"```bash\n(.*?)```", lambda m: "```bash\n" + re.sub(r" *\\\n\s*", " ", m.group(1)) + "```",
                  markdown, flags=re.DOTALL)


# ------------------------------------------------------------------------ the docs match the code


def _sections(page: str) -> dict[str, str]:
    """`## heading` -> its text, for a guide."""
    parts = re.split(r"^## (.+)$", page, flags=re.MULTILINE)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def command_paths() -> list[tuple[str, Any]]:
    """(`cmd` or `group sub`, the click command) for every command of the typer app."""
    root = typer.main.get_command(app)
    found = []
    for name, command in sorted(root.commands.items()):
        for sub_name, sub in sorted((getattr(command, "commands", None) or {name: command}).items()):
            found.append((name if sub is command else f"{name} {sub_name}", sub))
    return found


@pytest.mark.parametrize(("path", "command"), command_paths(), ids=lambda v: v if isinstance(v, str) else "")
def test_the_command_guide_has_a_section_for_every_command_and_option(path: str, command: Any) -> None:
    """docs/guides/cli.md: a `## `gpucluster <path> ...`` section for every command of the app, naming
    each of its options and arguments (its own text, not only the generated reference's table)."""
    guide = _sections((DOCS / "guides" / "cli.md").read_text())
    text = "\n".join(f"{heading}\n{body}" for heading, body in guide.items()
                     if re.match(rf"`gpucluster {re.escape(path)}(?=[ `])", heading))
    assert text, f"docs/guides/cli.md has no section for `gpucluster {path}`"
    for param in command.params:
        if param.param_type_name == "option":
            shown = next(o for o in param.opts if o.startswith("--")) if any(
                o.startswith("--") for o in param.opts) else param.opts[0]
            assert re.search(rf"`[^`]*{re.escape(shown)}(?![\w-])", text), (path, shown)
        else:
            assert str(param.name).upper() in text, (path, param.name)


def test_the_command_guide_has_no_section_for_a_command_that_is_gone() -> None:
    known = {path for path, _ in command_paths()}
    for heading in _sections((DOCS / "guides" / "cli.md").read_text()):
        match = re.match(r"`gpucluster ((?:[a-z-]+)(?: [a-z-]+)?)", heading)
        if match:
            words = match.group(1)
            assert words in known or words.split()[0] in known, heading


def layout_entries() -> dict[str, str]:
    """The layout map of docs/development.md: each folder or module of the package -> its text."""
    doc = (DOCS / "development.md").read_text()
    layout = doc.split("## Layout", 1)[1].split("```\n", 1)[1].split("```", 1)[0]
    entries: dict[str, str] = {}
    current = None
    for line in layout.splitlines():
        entry = re.match(r"^ {4}(\S+)\s", line)
        if entry:
            current = entry.group(1)
            entries[current] = line
        elif current and line.startswith(" " * 23):
            entries[current] += " " + line.strip()
        else:
            current = None
    return entries


def missing_from_layout(root: Path, entries: dict[str, str]) -> list[str]:
    """The modules under `root` the layout map does not name: a top-level module by its file name, a
    folder by `name/`, and each module of a folder (its stem) in that folder's entry."""
    text = " ".join(f"{k} {v}" for k, v in entries.items())
    missing = []
    for module in sorted(root.rglob("*.py")):
        parts = module.relative_to(root).parts
        if len(parts) == 1:
            if not re.search(rf"(?<![\w/.]){re.escape(module.name)}\b", text):
                missing.append(module.name)
            continue
        folder = entries.get(f"{parts[0]}/")
        if folder is None:
            missing.append(f"{parts[0]}/")
            continue
        for part in [*parts[1:-1], module.stem]:
            if part not in ("__init__", "__main__") and not re.search(rf"\b{re.escape(part)}\b", folder):
                missing.append("/".join(parts))
    return sorted(set(missing))


def test_every_module_is_in_the_layout_map() -> None:
    """docs/development.md "Layout" names every module of the package (add a new one there)."""
    assert missing_from_layout(REPO / "components" / "gpucluster", layout_entries()) == []


def test_the_layout_check_finds_a_missing_module(tmp_path: Path) -> None:
    for name in ("plan.py", "ops/__init__.py", "ops/scale.py", "ops/newthing.py", "extra/a.py", "lone.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    entries = {"plan.py": "    plan.py  runs the program", "ops/": "    ops/  day two: scale (scale)"}
    assert missing_from_layout(tmp_path, entries) == ["extra/", "lone.py", "ops/newthing.py"]


# The elements Python-Markdown (tables, fenced code, admonitions) and MkDocs Material (heading anchors,
# code-copy buttons) put inside a page's <article>: any other tag there is a placeholder of the Markdown
# (`Pulumi.<name>.yaml`) the browser took for an element and did not show.
ARTICLE_TAGS = frozenset({
    "a", "abbr", "blockquote", "br", "button", "code", "dd", "del", "details", "div", "dl", "dt", "em",
    "h1", "h2", "h3", "h4", "h5", "h6", "hr", "img", "kbd", "li", "mark", "nav", "ol", "p", "path", "pre",
    "span", "strong", "sub", "summary", "sup", "svg", "table", "tbody", "td", "th", "thead", "tr", "ul"})
# What a swallowed placeholder leaves: `Pulumi..yaml`, `s3..amazonaws.com`, `policies/config/.json`
# (not a range, `0..100`, nor an ellipsis).
REMNANT = re.compile(r"[^\s(]*(?<!\.)\.\.[A-Za-z][^\s)]*|[^\s(]*/\.(?:json|ya?ml)\b")


class ArticleParser(HTMLParser):
    """The tags and the text inside a built page's <article> (the page's Markdown, rendered)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth, self.tags, self.text = 0, set[str](), list[str]()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "article":
            self.depth += 1
        elif self.depth:
            self.tags.add(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "article":
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.text.append(data)


def swallowed(html: str) -> list[str]:
    """What a reader of the built page loses: unknown tags, and the remnants they leave in the text."""
    parser = ArticleParser()
    parser.feed(html)
    text = "".join(parser.text)
    assert text.strip(), "no <article> in the page"
    return [f"<{tag}>" for tag in sorted(parser.tags - ARTICLE_TAGS)] + REMNANT.findall(text)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as .ci/run builds it (strict: a broken link or anchor fails)."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=REPO, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.parametrize("name", sorted(p.stem for p in (DOCS / "reference").glob("*.md")))
def test_the_built_reference_pages_show_every_placeholder(site: Path, name: str) -> None:
    assert swallowed((site / "reference" / name / "index.html").read_text()) == []


def test_the_placeholder_check_catches_a_swallowed_placeholder() -> None:
    page = ("<html><body><article><p>Stack (Pulumi.<name>.yaml); default policies/config/<stack>.json, "
            "else <environment>.json; 0..100 spot; STACK...</p>"
            "<table><tr><td><code>&lt;tag&gt;</code></td></tr></table></article></body></html>")
    assert swallowed(page) == ["<environment>", "<name>", "<stack>", "Pulumi..yaml", "policies/config/.json"]
    assert swallowed(page.replace("<name>", "&lt;name&gt;").replace("<stack>", "&lt;stack&gt;")
                     .replace("<environment>", "&lt;environment&gt;")) == []


def test_semantic_versioning_and_the_changelog() -> None:
    releases = (DOCS / "releases.md").read_text()
    assert "[Semantic Versioning](https://semver.org/spec/v2.0.0.html)" in releases
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert "[Keep a Changelog](https://keepachangelog.com/en/1.1.0/)" in changelog
    assert changelog.split("\n## ", 1)[1].startswith("[Unreleased]")
