"""Waiting for a ``rasterflow`` subprocess without hiding a hang: on a timeout, dump where every process of the run
was (py-spy when installed, else the CLI's SIGUSR1 stack dump), then kill it and fail with what it printed."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["finish"]


def _stacks(pid: int) -> str:
    beside = Path(sys.executable).with_name("py-spy")  # the test venv's, when its bin/ is not on PATH
    spy = str(beside) if beside.exists() else shutil.which("py-spy")
    if spy is not None:
        try:
            dumped = subprocess.run([spy, "dump", "--pid", str(pid), "--subprocesses"], capture_output=True,
                                    text=True, timeout=60)
            return dumped.stdout + dumped.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"(py-spy failed: {exc})"
    try:
        os.kill(pid, signal.SIGUSR1)  # rasterflow.cli dumps every thread on it (faulthandler): to the run's stderr
        time.sleep(2)
    except OSError as exc:
        return f"(SIGUSR1 failed: {exc})"
    return "(stacks: see the SIGUSR1 dump in stderr below)"


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the run and every process under it: an orphaned worker would keep the pipes open."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for member in tree:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=10)


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """``proc.communicate(timeout)``, but a run that does not end fails the test with its stacks and its output."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stacks = _stacks(proc.pid)
        _kill(proc)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:  # something outside the tree still holds the pipes
            out, err = "(the pipes stayed open)", ""
        raise AssertionError(
            f"pid {proc.pid} ({' '.join(map(str, proc.args))}) did not end in {timeout} s; load average "
            f"{os.getloadavg()}\n--- stacks ---\n{stacks}\n--- stdout ---\n{_text(out)[-6000:]}\n"
            f"--- stderr ---\n{_text(err)[-12000:]}") from None
    return _text(out), _text(err)
