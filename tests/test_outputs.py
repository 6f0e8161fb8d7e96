"""Output files: normal permissions, symlinks and special files honoured, OS errors as one line,
a closed stdout that loses nothing."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from planner.cli import main


def _plan(path: str) -> int:
    return main(["plan", "--model", "mlp", "--method", "dp", "--json", path, "-q"])


def test_new_file_gets_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        assert _plan(str(tmp_path / "p.json")) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "p.json").stat().st_mode) == 0o644


def test_existing_file_keeps_its_mode(tmp_path):
    target = tmp_path / "p.json"
    target.write_text("{}")
    target.chmod(0o640)
    assert _plan(str(target)) == 0
    assert (
        stat.S_IMODE(target.stat().st_mode) == 0o640
        and json.loads(target.read_text())["method"] == "dp"
    )


def test_symlink_is_written_through(tmp_path):
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("{}")
    link.symlink_to(target)
    assert _plan(str(link)) == 0
    assert link.is_symlink() and json.loads(target.read_text())["method"] == "dp"


def test_fifo_is_written_in_place(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    assert _plan(str(fifo)) == 0
    reader.join(timeout=30)
    assert stat.S_ISFIFO(fifo.stat().st_mode) and json.loads(received[0])["method"] == "dp"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize(
    "path,words", [("/dev/full", "/dev/full"), ("", "empty path"), ("DIR", "directory")]
)
def test_unwritable_output_is_one_line_exit_2(tmp_path, capsys, path, words):
    path = str(tmp_path) if path == "DIR" else path
    assert _plan(path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--json" in err[0] and words in err[0], err


def test_dev_null_survives(tmp_path):
    assert _plan("/dev/null") == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_closed_stdout_ends_quietly_and_files_are_written(tmp_path):
    out = tmp_path / "p.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "planner",
            "plan",
            "--model",
            "mlp",
            "--method",
            "dp",
            "--json",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()  # the reader went away before anything was printed (`| head -0`)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert json.loads(out.read_text())["method"] == "dp"
    models = subprocess.run(
        f"{sys.executable} -m planner models | head -1", shell=True, capture_output=True, text=True
    )
    assert models.stdout.startswith("model") and "Traceback" not in models.stderr


def test_dev_stdout_receives_the_plan_and_survives(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner",
            "plan",
            "--model",
            "mlp",
            "--method",
            "dp",
            "-q",
            "--json",
            "/dev/stdout",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["method"] == "dp"
    # still the link to the process's stdout, not a regular file
    assert os.path.islink("/dev/stdout")


def test_relative_graph_path_in_a_plan_works_from_another_directory(tmp_path, monkeypatch):
    from planner.ir.graph_json import save_graph
    from planner.zoo.transformers import mlp

    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir()
    other.mkdir()
    save_graph(mlp(batch=16, hidden=32), work / "g.json")
    monkeypatch.chdir(work)
    assert main(["plan", "--model", "g.json", "--method", "dp", "--json", "p.json", "-q"]) == 0
    monkeypatch.chdir(other)
    assert main(["export", "--plan", str(work / "p.json"), "--json", "s.json", "-q"]) == 0
    assert (other / "s.json").is_file()
