"""The command line (``planner plan|evaluate|compare|pipeline|models|import-torch|export|verify``)
on top of ``planner.api``: argument parsing, exit codes, and the text reports."""

from planner.cli.main import main

__all__ = ["main"]
