"""The documentation keeps up with the code: docs/configuration.md documents every option of
config/_options.py with its real default, and no option that does not exist; every failover-URL
name is listed. Also the README's two commands, and every relative link of README.md and
docs/*.md (file and heading) resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from config import FAILOVER_OPTIONS, OPTIONS

ROOT = Path(__file__).parents[2]
CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: A table row whose first cell is an option name: "| `retry_interval` | 100 | ms | ...".
_ROW = re.compile(r"^\| `([a-z_]+)` \|(.*)$", re.MULTILINE)


def _section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next ``## `` heading."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _rows(section: str) -> dict[str, list[str]]:
    """Option name -> the cells after the first, for every option row of the section's tables."""
    rows: dict[str, list[str]] = {}
    for name, rest in _ROW.findall(section):
        assert name not in rows, f"{name} has two rows"
        rows[name] = [cell.strip() for cell in rest.strip().strip("|").split("|")]
    return rows


def _shown(default: object) -> str:
    """How the reference shows a default."""
    match default:
        case None:
            return "unset"
        case ():
            return "required"
        case bool():
            return str(default).lower()
        case (str() as host, int() as port):
            return f"{host}:{port}"
        case (int() as x, int() as y):
            return f"[{x}, {y}]"
        case _:
            return str(default)


def test_option_reference_lists_every_option_and_no_other() -> None:
    rows = _rows(_section(CONFIGURATION_DOC.read_text(), "Option reference"))
    assert set(OPTIONS) - set(rows) == set(), "options missing from docs/configuration.md"
    assert set(rows) - set(OPTIONS) == set(), "docs/configuration.md documents unknown options"


@pytest.mark.parametrize("name", list(OPTIONS))
def test_option_reference_shows_the_real_default_and_a_reason(name: str) -> None:
    default, unit, _range, why = _rows(_section(CONFIGURATION_DOC.read_text(), "Option reference"))[
        name
    ]
    assert _shown(OPTIONS[name].default) in default, f"{name}: default is not {default!r}"
    if OPTIONS[name].unit:
        assert OPTIONS[name].unit in unit, f"{name}: unit {OPTIONS[name].unit!r} not shown"
    if OPTIONS[name].default is not None:
        assert why, f"{name} has no reason for its default"


def test_failover_url_names_are_documented() -> None:
    rows = _rows(_section(CONFIGURATION_DOC.read_text(), "Failover URL names"))
    with_url_names = {o.field for o in FAILOVER_OPTIONS}
    assert set(rows) == with_url_names
    for option in FAILOVER_OPTIONS:
        assert f"`{option.name}`" in " ".join(rows[option.field]), option.name


def test_readme_keeps_the_two_commands_of_a_fresh_machine() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/setup.sh && .venv/bin/mq-sidecar drill\n" in readme
    assert "\nbash scripts/test.sh\n" in readme
    assert "exec bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: link to missing {target}"
        if anchor:
            assert anchor in _anchors(linked), f"{page.name}: no heading for {target}"
