"""Child processes that die with the planner: each engine run starts in a process group of its own,
and any exception while it runs (Ctrl-C, SIGTERM raised as ``Terminated``, a time-out) ends the
whole group, so no rank of a torchrun job outlives the command that started it (SIGKILL of the
launcher alone would leave its ranks running)."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Sequence

GRACE_S = 3.0  # between SIGTERM and SIGKILL of a group


def run_group(cmd: Sequence[str], timeout_s: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)`` in a new session;
    raises ``subprocess.TimeoutExpired`` as it does, after the group is stopped."""
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        stop_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL to what is left after ``GRACE_S``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.communicate(timeout=GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue
        except BaseException:  # a second interrupt while stopping: finish the stop, then leave
            continue
