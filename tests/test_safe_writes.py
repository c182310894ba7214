"""Safe writes: one writer per output (a real OS lock, real overlapping processes), only our outputs replaced, reports
that belong to the run that made the output, temp files unique per run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


import numpy as np
import pytest
import rasterio
import xarray as xr
from click.testing import CliRunner

from conftest import sample_with_truncated_file, spec_text
from procs import finish
from rasterflow.cli import cli
from rasterflow.lock import OutputLock, lock_path_for
from reference import assert_same, load_items, masked_ndvi, reduce_reference

RASTERFLOW = [sys.executable, "-m", "rasterflow"]


def _read(path: Path) -> np.ndarray:
    if path.suffix == ".zarr":
        return xr.open_zarr(path)["ndvi"].values
    with rasterio.open(path) as src:
        return src.read(1)


def _expected(sample) -> np.ndarray:
    return reduce_reference(masked_ndvi(load_items(sample)), "median")


def _holds_the_lock(out: Path, pid: int) -> bool:
    path = lock_path_for(str(out))
    return path.exists() and f"{pid}" in path.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.parametrize("suffix", ["zarr", "tif"])
def test_overlapping_runs_one_writes_the_other_exits_75(sample, tmp_path, suffix):
    """Two real runs of one spec, overlapping three ways: started at once (they race for the lock), the second
    started while the first holds the lock (the first is held mid-run with SIGSTOP, so the overlap does not depend
    on how fast a run is: with fixed delays this test broke when runs got faster), and the second started after
    the first finished (it finds the output and, ``if_exists: error``, refuses it)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}", output=f"out/r.{suffix}",
                              chunks="{time: -1, y: 16, x: 16}",
                              cluster="{n_workers: 1, threads_per_worker: 1, memory_limit: 1GB}"))
    out = tmp_path / "out" / f"r.{suffix}"
    expected = _expected(sample)

    def start() -> subprocess.Popen:
        return subprocess.Popen([*RASTERFLOW, "run", str(spec), "-q"], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    for overlap in ("at once", "mid-run", "after"):
        first = start()
        if overlap == "mid-run":
            deadline = time.monotonic() + 60
            while not _holds_the_lock(out, first.pid) and time.monotonic() < deadline:
                assert first.poll() is None, first.communicate()
                time.sleep(0.02)
            assert _holds_the_lock(out, first.pid)
            first.send_signal(signal.SIGSTOP)  # the first run, holding the lock, stands still mid-run
            try:
                second = start()
                second_out = finish(second, 180)
            finally:
                first.send_signal(signal.SIGCONT)
            outs = [finish(first, 180), second_out]
        else:
            if overlap == "after":
                finish(first, 180)
            second = start()
            outs = [finish(p, 180) for p in (first, second)]
        procs = (first, second)
        codes = sorted([first.returncode, second.returncode])
        winner, loser = (0, 1) if first.returncode == 0 else (1, 0)
        if overlap == "after":  # the first had finished: the second finds the output and refuses it
            assert codes == [0, 2], (overlap, outs)
        else:
            # exactly one wrote it; the other touched nothing and said who holds the lock
            assert codes == [0, 75], (overlap, outs)
            if overlap == "mid-run":
                assert second.returncode == 75, outs
            # the holder's pid, or, when both started at once and the loser looked between the holder's taking the
            # lock and writing its details into it, that (the same refusal, exit 75, nothing touched)
            said = outs[loser][1]
            assert f"pid {procs[winner].pid} on " in said or "has not written its details yet" in said, said
        report = json.loads(Path(str(out) + ".report.json").read_text())
        assert report["status"] == "ok" and report["outputs"][0]["path"] == str(out)
        assert_same(_read(out), expected)  # whole and correct
        assert not [p.name for p in out.parent.iterdir() if ".rasterflow-stream" in p.name
                    or ".rasterflow-partial" in p.name or p.name.endswith(".partial")]
        losers = list((tmp_path / ".rasterflow" / "reports").glob("*.report.json"))
        assert losers and all(json.loads(p.read_text())["status"] in ("locked", "invalid") for p in losers)
        for p in losers:
            p.unlink()
        # start over for the next case: remove the output and its report (the lock file stays, by design)
        import shutil

        shutil.rmtree(out) if out.is_dir() else out.unlink()
        Path(str(out) + ".report.json").unlink()


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_a_held_lock_refuses_at_once_and_touches_nothing(write_spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(reduce="{method: median}", output="out/held.zarr")
    out = tmp_path / "out" / "held.zarr"
    with OutputLock(str(out), spec="someone else"):
        started = time.monotonic()
        result = _invoke("run", str(spec))
        assert time.monotonic() - started < 5  # refused before the search and the cluster
    assert result.exit_code == 75, result.output
    assert f"pid {os.getpid()} on " in result.output and "someone else" in result.output
    assert not out.exists() and not Path(str(out) + ".report.json").exists()
    entry = json.loads((tmp_path / ".rasterflow" / "run_results.json").read_text())["results"][0]
    assert entry["status"] == "locked" and entry["exit_code"] == 75
    assert json.loads(Path(entry["report"]).read_text())["status"] == "locked"


def test_overwrite_never_replaces_an_input_or_a_symlink(write_spec, sample, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    items = load_items(sample)
    victim = Path(items[0]["assets"]["nir"]["href"])
    before = victim.read_bytes()
    spec = write_spec(reduce="{method: median}", output=f"{victim}", extra="")
    spec.write_text(spec.read_text().replace(f"output: {{path: {victim}}}",
                                             f"output: {{path: {victim}, if_exists: overwrite}}"))
    result = _invoke("run", str(spec))
    assert result.exit_code == 2, result.output
    assert "is an input of this job" in result.output and victim.read_bytes() == before

    folder = tmp_path / "precious"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    link = tmp_path / "out" / "link.zarr"
    link.parent.mkdir(exist_ok=True)
    link.symlink_to(folder, target_is_directory=True)
    spec = write_spec("link.yaml", reduce="{method: median}", output="out/link.zarr")
    result = _invoke("run", str(spec), "--overwrite")
    assert result.exit_code == 2, result.output
    assert "symlink" in result.output
    assert (folder / "keep.txt").read_text() == "mine" and link.is_symlink()


@pytest.mark.slow
def test_dead_holder_is_taken_over_stale_temp_files_go_refusals_keep_the_report(write_spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = write_spec(reduce="{method: median}", output="out/c.tif")
    out = tmp_path / "out" / "c.tif"
    out.parent.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock_file = lock_path_for(str(out))
    lock_file.write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid, "started_at": "yesterday"}))
    leftover = out.parent / f".c.tif.rasterflow-stream-{dead.pid}-deadbeef.tif"
    leftover.write_bytes(b"x" * 1000)
    result = _invoke("run", str(spec))
    assert result.exit_code == 0, result.output
    assert f"left by pid {dead.pid}" in result.output
    assert not leftover.exists()
    own_report = Path(str(out) + ".report.json")
    report_bytes = own_report.read_bytes()
    mtime = out.stat().st_mtime_ns

    result = _invoke("run", str(spec))  # if_exists: error -> refused, exit 2
    assert result.exit_code == 2 and "already exists" in result.output
    assert own_report.read_bytes() == report_bytes and out.stat().st_mtime_ns == mtime
    refused = list((tmp_path / ".rasterflow" / "reports").glob("*-invalid.report.json"))
    assert len(refused) == 1 and json.loads(refused[0].read_text())["status"] == "invalid"

    result = _invoke("run", str(spec), "--overwrite")  # our own output: replaced
    assert result.exit_code == 0, result.output
    assert out.stat().st_mtime_ns != mtime
    assert json.loads(own_report.read_text())["fingerprint"]


@pytest.mark.slow
def test_a_file_that_appears_during_the_run_is_never_replaced(sample, tmp_path):
    spec = tmp_path / "race.yaml"
    spec.write_text(spec_text(sample, reduce="{method: median}", output="out/race.tif",
                              chunks="{time: -1, y: 16, x: 16}",
                              cluster="{n_workers: 1, threads_per_worker: 1, memory_limit: 1GB}")
                    .replace("output: {path: out/race.tif}", "output: {path: out/race.tif, if_exists: overwrite}"))
    out = tmp_path / "out" / "race.tif"
    proc = subprocess.Popen([*RASTERFLOW, "run", str(spec)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out.parent.exists() and any(".rasterflow-stream-" in p.name for p in out.parent.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    out.write_bytes(b"someone else's file")  # nothing was there when the run decided: it must stay
    _stdout, stderr = finish(proc, 120)
    assert proc.returncode != 0 and "appeared during the run" in stderr, stderr
    assert out.read_bytes() == b"someone else's file"
    assert not [p for p in out.parent.iterdir() if ".rasterflow-stream-" in p.name or "-partial-" in p.name]


@pytest.mark.slow
def test_worker_errors_go_to_the_worker_log_not_the_terminal(write_spec, sample, tmp_path):
    catalog, victim = sample_with_truncated_file(sample, tmp_path, 3)  # fails mid-computation
    spec = write_spec(catalog=str(catalog), reduce="{method: median}", output="out/fail.tif")
    result = subprocess.run([*RASTERFLOW, "run", str(spec)], cwd=tmp_path, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "distributed.worker" not in result.stderr, result.stderr
    log = tmp_path / "out" / "fail.tif.workers.log"
    assert victim.name in log.read_text()
    assert json.loads((tmp_path / "out" / "fail.tif.report.json").read_text())["cluster"]["worker_log"] == str(log)
