"""The package runs from a checkout with nothing beside it: no module reads outside the
repository."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ways code has reached a folder beside the checkout: '../x', a parent of the repository, 'shared/'
OUTSIDE = [
    re.compile(p)
    for p in (
        r"\.\./",
        r"parents\[\d+\]\.parent",
        r"[\"']shared[\"']",
        r"shared/reference",
        r"REPO\.parent",
        r"ROOT\.parent",
    )
]


def _sources() -> list[Path]:
    return sorted(
        p
        for folder in ("planner", "experiments", "tests", "benchmarks")
        for p in (REPO / folder).rglob("*.py")
        if p.resolve() != Path(__file__).resolve()
    )


def test_no_module_refers_to_a_parent_of_the_repository():
    offenders = [
        f"{p.relative_to(REPO)}:{i}: {line.strip()}"
        for p in _sources()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if any(r.search(line) for r in OUTSIDE)
    ]
    assert not offenders, offenders
    assert len(_sources()) > 40  # the scan saw the code


def test_builtin_datasheet_table_is_packaged():
    from planner.cluster.profiles import load_profiles

    profiles = load_profiles()  # no path: the table inside the package
    assert {"v100-16g", "a100-40g", "a100-80g", "h100-80g", "h200-141g"} <= set(profiles)
    assert profiles["a100-80g"].peak_flops == 312e12 and profiles["a100-80g"].memory_bytes == 80e9


def _copy_checkout(dest: Path) -> None:
    """The files git would clone (tracked, plus new files not ignored): the working tree's state."""
    listed = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)


@pytest.mark.skipif(
    shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs a git checkout"
)
def test_plan_runs_from_a_clone_with_nothing_beside_it(tmp_path):
    clone = tmp_path / "planner-clone"
    _copy_checkout(clone)
    assert [p.name for p in tmp_path.iterdir()] == ["planner-clone"]  # nothing beside the checkout
    env = {**os.environ, "PYTHONPATH": str(clone)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner",
            "plan",
            "--model",
            "mlp",
            "--mesh",
            "2x4",
            "--json",
            "p.json",
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "OPTIMAL" in proc.stdout and (clone / "p.json").is_file()
    where = subprocess.run(
        [sys.executable, "-c", "import planner; print(planner.__file__)"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
    ).stdout
    assert where.startswith(str(clone))  # the clone's package ran, not the development checkout's
