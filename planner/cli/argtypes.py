"""What every command's parser shares: exit codes, the parser that fails in one line, option types
(each refusing bad text with a message naming what it wants) and the option groups of several
commands (logging, pictures, a plan file's source)."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys

from planner.cluster.profiles import get_profile
from planner.errors import SettingsError
from planner.units import MAX_COUNT, bytes_text
from planner.pipeline.schedule import parse_schedule

EXIT_OK, EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_NOT_OPTIMAL, EXIT_MISMATCH = 0, 2, 3, 4, 5


def byte_size(text: str) -> float:
    if text.strip().lower() in ("none", "inf", "unlimited"):
        return float("inf")
    match = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([KMGT]i?B?|B)?\s*", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"cannot parse byte size {text!r} (e.g. 80e9, 40GiB, 16GB)"
        )
    value = float(match.group(1))
    unit = (match.group(2) or "B").rstrip("B") or ""
    scale = {
        "": 1,
        "K": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
    }[unit]
    if value * scale > 2.0**60:  # no device holds more; the reports would print 300 digits
        raise argparse.ArgumentTypeError(
            f"{text!r} is over 2^60 bytes (1 EiB): no device holds that much"
        )
    return value * scale


def memory_limit(args: argparse.Namespace) -> float | None:
    """The memory limit per device of ``--memory`` (None: the device's budget) less
    ``--memory-headroom``."""
    headroom = getattr(args, "memory_headroom", 0.0) or 0.0
    if headroom == 0.0:
        return args.memory
    if not math.isfinite(headroom) or headroom < 0:
        raise SettingsError(f"--memory-headroom: must be a finite size >= 0, got {headroom:g}")
    limit = args.memory
    if limit is None:
        limit = get_profile(args.device or "a100-80g", args.hardware).budget_bytes
    if headroom >= limit:
        raise SettingsError(
            f"--memory-headroom: {headroom:.4g} bytes leave nothing of the {limit:.4g}-byte limit"
        )
    return limit - headroom


def add_logging(p: argparse.ArgumentParser, top: bool) -> None:
    # Accepted before or after the command; the command's copy only overrides when given.
    default = (lambda value: value) if top else (lambda value: argparse.SUPPRESS)
    p.add_argument(
        "-v", "--verbose", action="count", default=default(0), help="more log lines (-vv: debug)"
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default(False),
        help="errors only; no plan text",
    )
    p.add_argument("--debug", action="store_true", default=default(False), help="show tracebacks")


def cut_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(c) for c in text.split(",") if c.strip()) if text.strip() else ()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated layer indices, got {text!r}"
        ) from None


class Parser(argparse.ArgumentParser):
    """Argument errors as one line naming the option, exit code 2 (no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def schedule_name(text: str) -> str:
    try:
        parse_schedule(text)
    except SettingsError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--schedule: ")) from None
    return text


def number(convert, valid, what: str):
    """An argparse type: ``convert`` the text, then check ``valid``; one message names what is
    wanted."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not valid(value):
            shown = text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"
            raise argparse.ArgumentTypeError(f"must be {what}, got {shown!r}")
        return value

    return parse


seed = number(int, lambda v: 0 <= v < 2**31, "an integer in 0..2^31-1")


positive_int = number(int, lambda v: 1 <= v < MAX_COUNT, "a positive integer below 2^40")


def count_or_auto(text: str) -> int | str:
    """A micro-batch count, or ``auto`` (search every divisor of the batch)."""
    return "auto" if text == "auto" else positive_int(text)


seconds = number(float, lambda v: 0 < v < float("inf"), "a positive finite number of seconds")


# finite: NaN compares below every difference and would pass any run; a negative one would fail
# every run whatever it measured
tolerance = number(float, lambda v: 0 <= v < math.inf, "a finite non-negative relative tolerance")


non_negative = number(float, lambda v: 0 <= v < 2**30, "a non-negative number of MiB")


def add_picture(p: argparse.ArgumentParser, what: str) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--png", help=f"{what} into this PNG file (needs the plot extra: matplotlib)"
    )
    group.add_argument(
        "--svg", help=f"{what} into this SVG file (needs the plot extra: matplotlib)"
    )


def add_plan_source(p: argparse.ArgumentParser) -> None:
    add_logging(p, top=False)
    p.add_argument("--plan", required=True, help="plan JSON written by `planner plan --json`")
    p.add_argument("--model", help="model of the plan (default: the plan's 'source')")
    p.add_argument("--batch", type=positive_int, help="global batch (default: the plan's 'source')")
    p.add_argument(
        "--seq", type=positive_int, help="sequence length (default: the plan's 'source')"
    )


def does_not_fit(memory: float, limit: float | None, args: argparse.Namespace) -> int:
    """Exit 3, no file written: the plan needs ``memory`` bytes per device over ``limit``."""
    over = "" if limit is None else f" over the {bytes_text(limit)} limit"
    return infeasible(f"the plan does not fit: {bytes_text(memory)} per device{over}", args)


def infeasible(why: str, args: argparse.Namespace) -> int:
    """Exit 3 with ``why`` on stderr; no file written (an existing --json/--csv is kept)."""
    written = [f for f in (args.json, args.csv) if f is not None]
    nothing = f" (nothing written to {', '.join(written)})" if written else ""
    print(f"planner: infeasible: {why}{nothing}", file=sys.stderr)
    return EXIT_INFEASIBLE


def plan_source(args: argparse.Namespace) -> dict:
    """What a plan file records of its input (``source``): the model, batch, sequence, device and
    datasheet table, so that ``evaluate --plan`` and the other readers re-cost it alone."""
    model = args.model
    if isinstance(model, str) and model.endswith(".json"):
        model = os.path.abspath(model)  # a plan read from another directory still finds its graph
    device = getattr(args, "device", None)
    if isinstance(device, str) and device.endswith(".json"):
        # a profile file: the plan records where it is, not its name
        device = os.path.abspath(device)
    # a datasheet table: its row is re-read with the plan
    hardware = getattr(args, "hardware", None)
    return {
        "model": model,
        "batch": args.batch,
        "seq": args.seq,
        **({"device": device} if device else {}),
        **({"hardware": os.path.abspath(hardware)} if hardware else {}),
    }
