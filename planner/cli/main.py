"""Command line: ``planner models | plan | compare | pipeline | evaluate | import-torch | export |
verify``.

Every option a command accepts is used; an option that cannot apply (a pipeline option without
``--pipeline auto``, ``--mesh`` beside ``--plan`` or ``--tp``) is refused with exit code 2.
Exit codes: 0 a plan was found, 2 bad input (one line on stderr naming the field), 3 infeasible
(or no plan found), 4 a time-limited plan that is not proven optimal under ``--require-optimal``,
5 ``verify`` found a mismatch beyond tolerance, 130 interrupted. Output files are written before
the report is printed, so a closed stdout (``planner ... | head``) loses nothing.
"""

from __future__ import annotations

import logging
import sys
from typing import Sequence

from planner.cli.commands import COMMANDS
from planner.cli.argtypes import EXIT_BAD_INPUT, EXIT_INFEASIBLE
from planner.cli.parser import build_parser
from planner.errors import InfeasibleError, PlannerError
from planner.cost.settings import flag_message
from planner.outputs import check_writable
from planner.signals import exit_code, install_handlers


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * args.verbose if not args.quiet else logging.ERROR
    logging.basicConfig(
        level=max(level, logging.DEBUG), format="%(levelname)s %(name)s: %(message)s"
    )
    install_handlers()
    try:
        _check_outputs(args)
        return COMMANDS[args.command](args)
    except InfeasibleError as exc:
        if args.debug:
            raise
        print(f"planner: infeasible: {exc}", file=sys.stderr)
        return EXIT_INFEASIBLE
    except PlannerError as exc:
        if args.debug:
            raise
        # a settings field the library names at the message's start, spelled as its option
        print(f"planner: error: {flag_message(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: nothing half-done is written
        return exit_code(exc)


# the options that name a file a command writes
OUTPUTS = ("json", "csv", "png", "svg", "out")


def _check_outputs(args) -> None:
    """Every output path checked before the command works: a path that cannot be written is
    refused before a search runs and before any other output is written."""
    for name in OUTPUTS:
        path = getattr(args, name, None)
        if isinstance(path, str):
            check_writable(path, f"--{name}")


if __name__ == "__main__":
    sys.exit(main())
