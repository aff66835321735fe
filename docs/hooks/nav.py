"""MkDocs hook: every docs/guides/*.md page is in the nav, even one mkdocs.yml does not name yet.

Guides arrive from several branches; a page the nav forgets would build but be unreachable
(with `omitted_files: warn` and `--strict`, the build fails). Pages the nav names keep their
place and title; the others are appended under "Guides", sorted by file name, titled by
their first heading. Runs at build time only; it never writes a file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _named(nav: Any) -> set[str]:
    """Every page path the nav (a list of dicts, lists and strings) names."""
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return set().union(*(_named(v) for v in nav.values())) if nav else set()
    if isinstance(nav, list):
        return set().union(*(_named(v) for v in nav)) if nav else set()
    return set()


def missing_guides(docs_dir: Path, nav: list[Any]) -> list[dict[str, str]]:
    """Nav entries for the guides under `docs_dir` that `nav` does not name."""
    named = _named(nav)
    entries = []
    for page in sorted((docs_dir / "guides").glob("*.md")):
        path = f"guides/{page.name}"
        if path not in named:
            first = next((line for line in page.read_text().splitlines() if line.startswith("# ")), page.stem)
            entries.append({first.removeprefix("# ").strip(): path})
    return entries


def on_config(config: Any, **_: Any) -> Any:
    nav = config["nav"]
    extra = missing_guides(Path(config["docs_dir"]), nav)
    if extra:
        for section in nav:
            if isinstance(section, dict) and "Guides" in section:
                section["Guides"].extend(extra)
                break
        else:
            nav.append({"Guides": extra})
    return config
