"""Interrupts that stop: SIGINT and SIGTERM end a run at once, with exit code 130 or 143.

CP-SAT runs in a helper thread (``run_interruptible``) while the main thread waits on it, so a
signal reaches Python at once; the main thread then stops the search and re-raises. CP-SAT's
own SIGINT handler is switched off by the callers (it would turn Ctrl-C into "time limit reached"
and a plan that looks like a result). Entry points (the CLI, experiments) call ``exit_code``.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Callable, TypeVar

T = TypeVar("T")
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every ``finally`` runs and nothing half-done is
    written."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


def install_handlers() -> None:
    """SIGTERM raises ``Terminated`` (SIGINT already raises KeyboardInterrupt). Main thread only."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_terminated)


def exit_code(exc: KeyboardInterrupt, prog: str = "planner") -> int:
    """One line on stderr and the conventional exit code of the signal."""
    print(
        f"{prog}: {'terminated' if isinstance(exc, Terminated) else 'interrupted'}; no result "
        "written",
        file=sys.stderr,
    )
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


def run_interruptible(
    work: Callable[[], T], stop: Callable[[], None], poll_s: float = 0.05, grace_s: float = 1.5
) -> T:
    """Run ``work`` in a helper thread; on KeyboardInterrupt call ``stop``, wait for the helper to
    return (at most ``grace_s``), and re-raise. The wait is on an Event, not ``Thread.join``, which
    an interrupt can leave in a state where it no longer waits."""
    box: dict = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # handed to the main thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="planner-solver", daemon=True).start()
    try:
        while not done.wait(poll_s):
            pass
    except KeyboardInterrupt:
        stop()
        done.wait(grace_s)
        raise
    if "error" in box:
        raise box["error"]
    return box["value"]
