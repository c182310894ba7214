"""A folder of specs as processes: --select / --exclude by tag and name, the results file, --dry-run, retry."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import spec_text

RASTERFLOW = [sys.executable, "-m", "rasterflow"]


def _write(folder: Path, sample, name: str, tags: str, **kwargs) -> Path:
    text = spec_text(sample, **kwargs).replace("name: test-run", f"name: {name}\ntags: {tags}")
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*RASTERFLOW, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_folder_select_results_dry_run_and_retry(sample, tmp_path):
    folder = tmp_path / "pipelines"
    folder.mkdir()
    small = "{n_workers: 1, threads_per_worker: 1, memory_limit: 2GB}"
    _write(folder, sample, "alpha", "[nightly, ndvi]", reduce="{method: median}", output="../out/alpha.zarr",
           cluster=small, extra="")
    late_catalog = tmp_path / "late" / "items.json"  # not there yet: beta fails the first night
    _write(folder, sample, "beta", "[nightly]", catalog=str(late_catalog), reduce="{method: mean}",
           output="../out/beta.tif", cluster=small)
    _write(folder, sample, "gamma", "[weekly]", reduce="{method: max}", output="../out/gamma.zarr", cluster=small)
    (folder / "notes.txt").write_text("not a spec")
    results = tmp_path / "results.json"

    validated = _cli("validate", str(folder), cwd=tmp_path)
    assert validated.returncode == 0, validated.stderr
    assert validated.stdout.count("ok   ") == 3
    globbed = _cli("validate", str(folder / "*.yaml"), "--select", "g*", cwd=tmp_path)
    assert globbed.returncode == 0 and globbed.stdout.count("ok   ") == 1 and "gamma" in globbed.stdout

    run = _cli("run", str(folder), "--select", "tag:nightly", "--results", str(results), "-q", cwd=tmp_path)
    assert run.returncode == 1, run.stderr  # the highest code: beta failed
    data = json.loads(results.read_text())
    entries = {e["name"]: e for e in data["results"]}
    assert set(entries) == {"alpha", "beta"}  # gamma not selected
    assert entries["alpha"]["status"] == "ok" and entries["alpha"]["exit_code"] == 0
    assert entries["alpha"]["outputs"] == [str(tmp_path / "out" / "alpha.zarr")]
    assert Path(entries["alpha"]["report"]).exists() and entries["alpha"]["seconds"] > 0
    assert entries["beta"]["status"] == "failed" and entries["beta"]["exit_code"] == 1 and entries["beta"]["error"]
    assert data["counts"] == {"ok": 1, "failed": 1} and data["finished_at"]
    assert not (tmp_path / "out" / "gamma.zarr").exists()

    dry = _cli("run", str(folder), "--exclude", "tag:weekly", "--dry-run", cwd=tmp_path)
    lines = dry.stdout.splitlines()
    assert any(line.startswith("refuse  alpha") and "invalid" in line for line in lines), dry.stdout  # output exists
    assert any(line.startswith("refuse  beta") for line in lines), dry.stdout  # the catalog is still missing
    assert not (tmp_path / ".rasterflow" / "run_results.json").exists()  # a dry run keeps the last results
    assert json.loads(results.read_text()) == data

    late_catalog.parent.mkdir()
    shutil.copy(sample.items_json, late_catalog)
    dry = _cli("run", str(folder / "beta.yaml"), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0 and dry.stdout.startswith("run     beta"), dry.stdout
    assert not (tmp_path / "out" / "beta.tif").exists()

    retried = _cli("retry", "--results", str(results), cwd=tmp_path)
    assert retried.returncode == 0, retried.stderr
    assert "retrying 1 spec(s)" in retried.stdout
    data = json.loads(results.read_text())
    assert [(e["name"], e["status"]) for e in data["results"]] == [("beta", "ok")]
    assert data["command"] == "retry" and (tmp_path / "out" / "beta.tif").exists()
    again = _cli("retry", "--results", str(results), cwd=tmp_path)
    assert again.returncode == 0 and "nothing to retry" in again.stdout

    none = _cli("run", str(folder), "--select", "tag:nope", cwd=tmp_path)
    assert none.returncode == 64 and "no spec left" in none.stderr
    missing = _cli("retry", "--results", str(tmp_path / "nope.json"), cwd=tmp_path)
    assert missing.returncode == 64
    several = _cli("run", str(folder), "--report", str(tmp_path / "r.json"), cwd=tmp_path)
    assert several.returncode == 64 and "--report" in several.stderr
