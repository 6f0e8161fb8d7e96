"""The CLI reference page, generated from the argument parser (the one source of every option,
its default and its help).

    python -m planner.cli.reference docs/cli.md     # rewrite the page
    python -m planner.cli.reference                 # print it
"""

from __future__ import annotations

import argparse
import sys

from planner.cli.parser import build_parser
from planner.outputs import write_text

HEADER = """# Command-line reference

Generated from the argument parser by `python -m planner.cli.reference docs/cli.md`; a test keeps
it equal to the parser, so every option of every command is listed here with its default and help.
`-v`, `-q` and `--debug` are accepted before or after the command.

Exit codes: 0 done, 2 bad input (one line naming the option or field), 3 infeasible or no plan
found, 4 not proven optimal under `--require-optimal`, 5 `verify`/`run-*` found a mismatch beyond
the tolerance, 130/143 interrupted.
"""


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {c.dest: c.help or "" for c in actions[0]._choices_actions} if actions else {}


def _row(action: argparse.Action) -> str:
    names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
    value = ""
    if action.nargs != 0 and action.option_strings:
        value = " " + (
            "{" + ",".join(map(str, action.choices)) + "}"
            if action.choices
            else action.dest.upper()
        )
    text = (action.help or "").replace("|", "\\|").replace("\n", " ")
    if action.required:
        text = "required. " + text
    return f"| {names}{value} | {text} |"


def markdown(parser: argparse.ArgumentParser | None = None) -> str:
    """The reference page: one table per command, one row per option."""
    parser = parser or build_parser()
    helps = _helps(parser)
    parts = [HEADER]
    for name, command in _commands(parser).items():
        parts.append(
            f"## `planner {name}`\n\n{helps.get(name, '')}\n\n| option | meaning |\n| --- | --- |"
        )
        rows = [_row(a) for a in command._actions if not isinstance(a, argparse._HelpAction)]
        parts.append("\n".join(rows) + "\n")
    return "\n".join(parts)


def option_strings(parser: argparse.ArgumentParser | None = None) -> dict[str, list[str]]:
    """Every command's option strings (what the page must list)."""
    parser = parser or build_parser()
    return {
        name: [o for a in command._actions for o in a.option_strings if o not in ("-h", "--help")]
        for name, command in _commands(parser).items()
    }


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    text = markdown()
    if args:
        write_text(args[0], text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
