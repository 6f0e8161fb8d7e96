"""What every experiment script shares: the --out/--resume options and the resumable results table."""

from __future__ import annotations

import argparse

import planner


def add_output_options(parser: argparse.ArgumentParser, default_out: str) -> None:
    parser.add_argument("--out", default=default_out, help=f"results CSV (default {default_out})")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows already in --out and skip their configurations")
    parser.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True,
                        help="also write a PNG next to the CSV (needs matplotlib; default on)")


def results_table(args: argparse.Namespace, keys: tuple[str, ...]) -> planner.ResultsTable:
    """The CSV of this run; written atomically after every configuration."""
    return planner.ResultsTable(args.out, keys, resume=args.resume)


def png_path(args: argparse.Namespace) -> str | None:
    """Where the plot goes (the CSV path with .png), or None when plots are off or matplotlib is absent."""
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
