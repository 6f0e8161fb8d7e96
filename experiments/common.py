"""What every experiment script shares: the --out/--resume options, the resumable results table
and PNG output (both written through ``planner.outputs``, the package's one file writer)."""

from __future__ import annotations

import argparse
import io
import math
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

import pandas as pd

from planner.outputs import write_bytes, write_csv


def gib(nbytes: float | None) -> float | None:
    """Bytes in GiB; None (a failed search's memory) stays None: an empty cell, never a number."""
    return None if nbytes is None else nbytes / 2**30


def add_output_options(parser: argparse.ArgumentParser, default_out: str) -> None:
    parser.add_argument("--out", default=default_out, help=f"results CSV (default {default_out})")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows already in --out and skip their configurations",
    )
    parser.add_argument(
        "--plot",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also write a PNG next to the CSV (needs matplotlib; default on)",
    )


def results_table(args: argparse.Namespace, keys: tuple[str, ...]) -> ResultsTable:
    """The CSV of this run; written atomically after every configuration. Every row records its
    provenance: the commit it was computed at and the command that reproduces it (every option
    spelled out, defaults included)."""
    spec = sys._getframe(1).f_globals.get("__spec__")  # the calling script, also under python -m
    module = spec.name if spec is not None else "experiments"
    return ResultsTable(
        args.out,
        keys,
        resume=args.resume,
        provenance={"commit": source_commit(), "command": command_line(module, args)},
    )


def command_line(module: str, args: argparse.Namespace) -> str:
    """``python -m MODULE`` with every parsed option (the run's exact configuration)."""
    words = ["python", "-m", module]
    for name, value in vars(args).items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            words.append(flag)
        elif value is False:
            words.extend([f"--no-{flag[2:]}"] if name == "plot" else [])
        elif value is not None:
            words.extend([flag, shlex.quote(str(value))])
    return " ".join(words)


def source_commit() -> str:
    """The commit the code was at (``+dirty`` when the package, experiments or benchmarks differ
    from it; ``unknown`` outside a git checkout)."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "planner", "experiments", "benchmarks"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def png_path(args: argparse.Namespace) -> str | None:
    """Where the plot goes (the CSV path with .png), or None when plots are off or matplotlib is
    absent."""
    if not args.plot:
        return None
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib not installed: no plot (pip install -e '.[plot]')")
        return None
    return str(args.out).rsplit(".", 1)[0] + ".png"


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (plots are written, never shown)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def run(main) -> int:
    """Run an experiment's ``main``: Ctrl-C or SIGTERM stops it at once (exit 130/143, one line),
    and the configuration it was on is not recorded (``--resume`` runs it again)."""
    from planner.signals import exit_code, install_handlers

    install_handlers()
    try:
        return main()
    except KeyboardInterrupt as exc:
        return exit_code(exc, "experiments")


def write_png(path: Path | str, figure: Any) -> None:
    """Save a matplotlib figure (PNG) through the same writer as every other output."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    write_bytes(path, buffer.getvalue(), "--png")


class ResultsTable:
    """A results CSV written row by row, atomically, so an interrupted experiment can resume.

    Every ``add`` rewrites ``<path>.partial`` through a temporary file and a rename; ``finish``
    (the experiment ran to its end) moves it to ``path``. An interrupted run therefore leaves the
    committed CSV as it was, and its rows done so far in the partial file. With ``resume=True`` the
    rows already there (the partial file's, else the CSV's) are kept and ``done(key)`` tells which
    configurations to skip; ``key_columns`` name the configuration.
    """

    def __init__(
        self,
        path: Path | str,
        key_columns: Iterable[str],
        resume: bool = False,
        provenance: Mapping[str, str] | None = None,
    ) -> None:
        self.path = Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.key_columns = tuple(key_columns)
        self.provenance = dict(provenance or {})  # added to each new row (commit, command)
        self.rows: list[dict] = []
        source = self.partial if self.partial.exists() else self.path
        if resume and source.exists():
            frame = pd.read_csv(source, keep_default_na=False, na_values=[""])
            self.rows = [
                {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                for r in frame.to_dict("records")
            ]
        self._done = {self._key(r) for r in self.rows}

    def _key(self, row: Mapping[str, Any]) -> tuple:
        return tuple(str(row.get(k)) for k in self.key_columns)

    def done(self, **config: Any) -> bool:
        """True when a row with this configuration (the key columns) is already written."""
        return self._key(config) in self._done

    def add(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Append rows (one configuration's worth) and rewrite the partial file atomically."""
        for row in rows:
            self.rows.append({**dict(row), **self.provenance})
            self._done.add(self._key(row))
        write_csv(self.partial, self.rows)

    def finish(self) -> None:
        """Every configuration is done: the rows become the CSV (atomically), the partial file
        goes."""
        write_csv(self.path, self.rows)
        self.partial.unlink(missing_ok=True)


def with_provenance(
    rows: Iterable[Mapping[str, Any]], script: str, args: argparse.Namespace
) -> list[dict]:
    """A benchmark's rows with the commit and the command (``python SCRIPT`` and every option)."""
    command = f"python {script}" + command_line("", args).removeprefix("python -m ")
    return [{**dict(row), "commit": source_commit(), "command": command} for row in rows]
