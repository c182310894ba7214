"""Real signals on real processes: `timeout -s TERM` and a terminal's Ctrl-C (SIGINT to the whole process group)
stop a run cleanly: report `interrupted` with the real exit code, no worker left behind, no worker traceback, and
the rerun resumes to a result identical, bit for bit, to an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import xarray as xr

from conftest import spec_text
from procs import finish

pytestmark = pytest.mark.slow

RASTERFLOW = [sys.executable, "-m", "rasterflow"]


def _spec(sample, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(spec_text(sample, reduce="{method: median}", output=f"out/{name}.zarr",
                              chunks="{time: -1, y: 16, x: 16}",
                              cluster="{n_workers: 2, threads_per_worker: 1, memory_limit: 1GB}"))
    return path


def _wait_for_blocks(staging: Path, proc: subprocess.Popen, at_least: int = 20) -> None:
    done = staging / ".rasterflow" / "done"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if done.exists() and sum(1 for p in done.rglob("*") if p.is_file()) >= at_least:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the run wrote no blocks in time")


def _workers_of(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children(recursive=True)]


def _gone(procs: list[psutil.Process], timeout: float = 10) -> list[int]:
    _gone_, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p.pid for p in alive]


def _check_interrupted(out: Path, code: int, stderr: str, signame: str) -> None:
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if f"interrupted by {signame}" in line]
    assert len(lines) == 1 and "rerunning the same command resumes" in lines[0], stderr
    report = json.loads(Path(str(out) + ".report.json").read_text())
    assert report["status"] == "interrupted" and report["exit_code"] == code
    assert not out.exists() and Path(str(out) + ".partial").exists()


@pytest.fixture(scope="module")
def uninterrupted(sample, tmp_path_factory) -> np.ndarray:
    """The result of the same job run without interruption (once for the module)."""
    tmp_path = tmp_path_factory.mktemp("clean")
    spec = _spec(sample, tmp_path, "clean")
    ran = subprocess.run([*RASTERFLOW, "run", str(spec), "-q"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=180)
    assert ran.returncode == 0, ran.stderr
    return xr.open_zarr(tmp_path / "out" / "clean.zarr")["ndvi"].values


def _resume_and_compare(tmp_path: Path, spec: Path, expected: np.ndarray, out: Path) -> None:
    resumed = subprocess.run([*RASTERFLOW, "run", str(spec)], cwd=tmp_path, capture_output=True, text=True,
                             timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed:" in resumed.stdout
    np.testing.assert_array_equal(xr.open_zarr(out)["ndvi"].values, expected)  # bit for bit
    assert json.loads(Path(str(out) + ".report.json").read_text())["status"] == "ok"


@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs coreutils timeout")
def test_timeout_sigterm_mid_run_then_resume(sample, tmp_path, uninterrupted):
    spec = _spec(sample, tmp_path, "term")
    out = tmp_path / "out" / "term.zarr"
    # timeout runs the job in its own process group and, when it fires, sends SIGTERM to the job and the group
    # (workers included). It does exactly the same when it receives SIGTERM itself, which lets the test fire it
    # mid-run (once blocks are written) instead of guessing a duration.
    proc = subprocess.Popen(["timeout", "-s", "TERM", "600", *RASTERFLOW, "run", str(spec)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_blocks(Path(str(out) + ".partial"), proc)
    workers = _workers_of(proc.pid)
    assert len(workers) >= 3  # rasterflow, its two workers (and multiprocessing's helper)
    proc.send_signal(signal.SIGTERM)
    _stdout, stderr = finish(proc, 60)
    assert proc.returncode == 143, stderr
    assert _gone(workers) == []  # no orphaned worker processes
    _check_interrupted(out, 143, stderr, "SIGTERM")
    _resume_and_compare(tmp_path, spec, uninterrupted, out)


def test_ctrl_c_mid_run_then_resume(sample, tmp_path, uninterrupted):
    spec = _spec(sample, tmp_path, "int")
    out = tmp_path / "out" / "int.zarr"
    proc = subprocess.Popen([*RASTERFLOW, "run", str(spec)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for_blocks(Path(str(out) + ".partial"), proc)
    workers = _workers_of(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the whole foreground group gets it
    _stdout, stderr = finish(proc, 60)
    assert proc.returncode == 130, stderr
    assert _gone(workers) == []
    _check_interrupted(out, 130, stderr, "SIGINT")
    _resume_and_compare(tmp_path, spec, uninterrupted, out)


def test_a_signal_after_the_commit_still_reports_success(sample, tmp_path, monkeypatch):
    import io

    import rasterflow

    spec = tmp_path / "late.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}", output="out/late.zarr"))

    class SignalOnLastLine(io.StringIO):
        """The progress display: its last line is written once the writer has returned (the output is in place)."""

        def write(self, text: str) -> int:
            if "100%" in text:
                os.kill(os.getpid(), signal.SIGTERM)  # a real signal, to this process, after the commit
            return super().write(text)

    monkeypatch.setattr(sys, "stdout", SignalOnLastLine())
    result = rasterflow.run(spec, progress=True, handle_signals=True, state_dir=tmp_path / "state")
    assert result.status == "ok" and result.exit_code == 0
    report = json.loads(Path(result.report_path).read_text())
    assert report["status"] == "ok" and "SIGTERM arrived after the output was committed" in report["note"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the API put the handlers back


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the swallowed exception itself
def test_a_signal_whose_exception_python_swallowed_still_stops_the_run(sample, tmp_path, monkeypatch):
    """A real SIGINT whose handler runs inside a finalizer: Python prints the handler's exception ("Exception
    ignored in ... __del__") and drops it, as it did once in CI inside distributed's ``Future.__del__``, and the run
    went on to exit 0. The run now checks after every block that no signal is left unraised. Here the finalizer runs
    in the main thread when the plan is announced (``on_event``), before the first block."""
    import rasterflow

    spec = tmp_path / "swallowed.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}", output="out/swallowed.zarr",
                              chunks="{time: -1, y: 64, x: 64}"))
    fired = []

    class SignalInAFinalizer:
        def __del__(self) -> None:
            fired.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, inside __del__: its exception is swallowed
            fired.append(False)  # not reached: the handler's exception ended __del__

    def on_event(kind: str, fields: dict) -> None:
        if kind == "plan":
            SignalInAFinalizer()  # made and collected at once, in the main thread

    from rasterflow.errors import RunInterrupted

    # what was there before (SIG_IGN where the tests run as a background job of a non-interactive shell)
    before = signal.getsignal(signal.SIGINT)
    printed = []  # what Python's unraisable hook (the "Exception ignored in ..." traceback) would have shown

    def hook(unraisable) -> None:
        printed.append(unraisable.exc_value)

    monkeypatch.setattr(sys, "unraisablehook", hook)
    with pytest.raises(RunInterrupted) as raised:  # the API raises what interrupted the run, with its result
        rasterflow.run(spec, on_event=on_event, handle_signals=True, state_dir=tmp_path / "state")
    assert fired == [True]  # the handler's exception was raised inside __del__ (and dropped there by Python)
    assert printed == []  # ... without a traceback on the user's terminal (seen in CI: distributed's GC callback)
    assert sys.unraisablehook is hook  # and the hook was put back
    result = raised.value.result
    assert result.status == "interrupted" and result.exit_code == 130, (result.status, result.error)
    out = tmp_path / "out" / "swallowed.zarr"
    assert not out.exists()  # never committed
    assert signal.getsignal(signal.SIGINT) is before  # the API put the handlers back


def test_sighup_mid_cog_run_leaves_no_temp_file(sample, tmp_path):
    spec = tmp_path / "hup.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}", output="out/hup.tif", chunks="{time: -1, y: 16, x: 16}",
                              cluster="{n_workers: 1, threads_per_worker: 1, memory_limit: 1GB}"))
    out_dir = tmp_path / "out"
    proc = subprocess.Popen([*RASTERFLOW, "run", str(spec)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (out_dir.exists() and any(".rasterflow-stream-" in p.name for p in out_dir.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)  # some blocks in
    workers = _workers_of(proc.pid)
    os.killpg(proc.pid, signal.SIGHUP)  # the terminal went away: the whole session gets it
    _stdout, stderr = finish(proc, 60)
    assert proc.returncode == 129, stderr
    assert _gone(workers) == []
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if "interrupted by SIGHUP" in line]
    assert len(lines) == 1 and "rerunning the same command" in lines[0], stderr
    left = sorted(p.name for p in out_dir.iterdir() if p.name != "hup.tif.workers.log")  # (cancelled tasks)
    assert left == [".hup.tif.rasterflow-lock", "hup.tif.report.json"], left  # no temp file, no output
    report = json.loads((out_dir / "hup.tif.report.json").read_text())
    assert report["status"] == "interrupted" and report["exit_code"] == 129


def test_workers_never_outlive_a_killed_run(sample, tmp_path):
    # Workers ignore SIGTERM (the run stops them); when the run itself is killed with SIGKILL and cannot, they must
    # still go: nothing may be left running after a cron job is killed.
    spec = _spec(sample, tmp_path, "kill9")
    proc = subprocess.Popen([*RASTERFLOW, "run", str(spec)], cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    _wait_for_blocks(tmp_path / "out" / "kill9.zarr.partial", proc, at_least=5)
    workers = _workers_of(proc.pid)
    assert len(workers) >= 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    alive = _gone(workers, timeout=20)
    for pid in alive:  # do not leave them behind even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert alive == []


def test_sigusr1_prints_the_stacks_and_the_run_goes_on(sample, tmp_path, uninterrupted):
    spec = _spec(sample, tmp_path, "usr1")
    out = tmp_path / "out" / "usr1.zarr"
    proc = subprocess.Popen([*RASTERFLOW, "run", str(spec), "-q"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _wait_for_blocks(Path(str(out) + ".partial"), proc, at_least=5)
    proc.send_signal(signal.SIGUSR1)
    _stdout, stderr = finish(proc, 180)
    assert proc.returncode == 0, stderr
    assert "Current thread" in stderr or "Thread 0x" in stderr, stderr  # faulthandler's dump of every thread
    assert 'File "' in stderr and "rasterflow" in stderr, stderr
    np.testing.assert_array_equal(xr.open_zarr(out)["ndvi"].values, uninterrupted)
