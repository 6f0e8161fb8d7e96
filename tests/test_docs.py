"""The documentation: a short README whose first lines are the two commands, a CLI reference
equal to the parser, tables equal to the committed results, and a site that builds strictly."""

from __future__ import annotations

import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from planner.cli.reference import markdown, option_strings

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README has {len(lines)} lines"
    assert lines[0] == "# planner" and lines[2] == "```bash" and lines[5] == "```"
    install, test = lines[3], lines[4]
    assert "pip install" in install and "planner plan --model" in install
    assert test.endswith("python -m pytest")


def test_cli_reference_is_the_parser_and_lists_every_option():
    page = (ROOT / "docs" / "cli.md").read_text()
    assert page == markdown(), "docs/cli.md is stale: python -m planner.cli.reference docs/cli.md"
    commands = option_strings()
    assert len(commands) >= 11
    for command, options in commands.items():
        section = page.split(f"## `planner {command}`", 1)[1].split("\n## ", 1)[0]
        missing = [o for o in options if f"`{o}`" not in section]
        assert not missing, f"planner {command}: {missing} not in docs/cli.md"


def test_every_marked_table_equals_the_committed_results():
    from experiments.tables import fill

    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        assert fill(text, ROOT / "results") == text, (
            f"{path.name}: a table differs from results/ (python -m experiments.tables --readme "
            "README.md docs/*.md)"
        )


def test_every_page_is_in_the_site_navigation():
    config = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w-]+\.md)", config))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert pages == listed, (pages - listed, listed - pages)


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings")
    # the interpreter's own mkdocs: a `mkdocs` on PATH may belong to another environment
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("planner.api.plan") > 0


def test_the_code_map_names_every_module():
    """docs/concepts.md's architecture block names every module of the package (by file name or
    its folder), so a new module cannot go undocumented."""
    text = (ROOT / "docs" / "concepts.md").read_text()
    missing = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "planner").rglob("*.py"))
        if path.name not in ("__init__.py", "__main__.py")
        and path.name not in text
        and f"{path.stem}/" not in text
    ]
    assert not missing, f"not in the code map of docs/concepts.md: {missing}"


def _seed_ranges(path: Path) -> dict[str, int]:
    """Per mark ("default", "slow", "heavy"): the cases of ``path``'s tests parametrized over
    ``range(...)`` seeds, by each test's strictest mark."""
    import ast

    counts = {"default": 0, "slow": 0, "heavy": 0}
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef):
            continue
        marks, cases = set(), 0
        for deco in node.decorator_list:
            text = ast.unparse(deco)
            marks |= {m for m in ("slow", "heavy") if f"mark.{m}" in text}
            found = re.search(r"range\((\d+)(?:, (\d+))?\)", text)
            if "parametrize" in text and found:
                low, high = (0, found[1]) if found[2] is None else (found[1], found[2])
                cases = int(high) - int(low)
        counts["heavy" if "heavy" in marks else "slow" if "slow" in marks else "default"] += cases
    return counts


def test_the_test_counts_the_testing_page_quotes_are_the_suites():
    """docs/testing.md's counts of the certified search's enumeration cases and of the malformed
    inputs are read from the test files, so the page cannot drift from them."""
    import test_malformed

    page = " ".join((ROOT / "docs" / "testing.md").read_text().split())
    certify = _seed_ranges(ROOT / "tests" / "test_certify.py")
    total = sum(certify.values())
    assert (
        f"on {total} generated cases (tests/test_certify.py: {certify['default']} in the default "
        f"run, {certify['slow']} slow, {certify['heavy']} heavy)"
    ) in page, certify
    generated = test_malformed.test_generated_graph_json_is_rejected_by_field
    examples = generated._hypothesis_internal_use_settings.max_examples
    assert (
        f"(tests/test_malformed.py: {len(test_malformed.GRAPH_CASES)} graph files, "
        f"{len(test_malformed.RAW_CASES)} raw files, {len(test_malformed.CLI_CASES)} command lines"
    ) in page
    assert f"{examples} hypothesis-generated graphs" in page, examples
