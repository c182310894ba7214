"""The Python API end to end and the CLI contract: exit codes, global options anywhere, JSON-only stdout, closed pipes.

Real processes where the contract is about a process (exit code, stdout bytes, a closed pipe); real COGs and a real
LocalCluster for the API run, checked against the NumPy reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import rasterflow
from reference import assert_same, load_items, masked_ndvi, reduce_reference

RASTERFLOW = [sys.executable, "-m", "rasterflow"]


def _cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*RASTERFLOW, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_import_is_light_and_the_api_functions_are_not_shadowed_by_modules():
    code = ("import sys, rasterflow; heavy = [m for m in ('numpy', 'dask', 'xarray', 'rasterio', 'click', 'rich') "
            "if m in sys.modules]; import rasterflow.planning, rasterflow.commands; "
            "print(heavy, callable(rasterflow.plan), rasterflow.run.__module__, rasterflow.plan.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["[]", "True", "rasterflow.api", "rasterflow.api"]


@pytest.mark.slow
def test_api_load_plan_run_end_to_end(write_spec, sample, tmp_path, monkeypatch):
    monkeypatch.setenv("RF_TEST_OUT", "api-out")
    spec = write_spec(reduce="{method: median}", output="\"${RF_TEST_OUT}/${NAME:-r}.zarr\"")
    loaded = rasterflow.load_spec(spec, variables={"NAME": "median"})
    assert loaded.variables == {"RF_TEST_OUT": "api-out", "NAME": "median"}
    job = rasterflow.plan(loaded)
    assert job.report.ok and len(job.items) == 8
    events = []
    result = rasterflow.run(loaded, on_event=lambda kind, fields: events.append(kind), state_dir=tmp_path / "state")
    out = tmp_path / "api-out" / "median.zarr"
    assert result.status == "ok" and result.exit_code == 0 and result.outputs == (str(out),)
    assert result.report_path == str(out) + ".report.json" and result.report["status"] == "ok"
    assert json.loads(Path(result.report_path).read_text())["fingerprint"] == result.report["fingerprint"]
    assert {"start", "plan", "done"} <= set(events)
    items = load_items(sample, result.report["item_ids"])
    assert_same(xr.open_zarr(out)["ndvi"].values, reduce_reference(masked_ndvi(items), "median"))

    # the same run again: the output exists, if_exists defaults to error -> the error is raised, with the result
    with pytest.raises(rasterflow.OutputExistsError) as caught:
        rasterflow.run(loaded, state_dir=tmp_path / "state")
    assert isinstance(caught.value, FileExistsError)
    refused = caught.value.result
    assert refused.status == "invalid" and refused.exit_code == 2
    # the refused run's report went elsewhere: the output's own report still says ok
    assert refused.report_path.startswith(str(tmp_path / "state" / "reports"))
    assert json.loads((Path(str(out) + ".report.json")).read_text())["status"] == "ok"

    # asked to overwrite: our own store (its rasterflow_fingerprint attribute says so) is replaced
    replaced = rasterflow.run(loaded, overwrite=True, state_dir=tmp_path / "state")
    assert replaced.status == "ok" and replaced.report_path == str(out) + ".report.json"
    assert_same(xr.open_zarr(out)["ndvi"].values, reduce_reference(masked_ndvi(items), "median"))


def test_api_raises_spec_errors_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\nsource: ${NOT_SET_ANYWHERE_42}\n")
    with pytest.raises(rasterflow.SpecError) as caught:
        rasterflow.load_spec(bad, environ={})
    assert f"{bad}:3:9: source: variable NOT_SET_ANYWHERE_42 is not set" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_usage_errors_exit_64_not_2(tmp_path):
    result = _cli("plan", "--no-such-option", "x.yaml", cwd=tmp_path)
    assert result.returncode == 64, result.stderr
    assert "No such option" in result.stderr
    assert _cli("run", cwd=tmp_path).returncode == 64  # missing argument
    result = _cli("validate", "x.yaml", "--var", "NOEQUALS", cwd=tmp_path)
    assert result.returncode == 64 and "KEY=VALUE" in result.stderr
    assert _cli("validate", str(tmp_path / "missing.yaml"), cwd=tmp_path).returncode == 2  # invalid spec: still 2


def test_global_options_after_the_subcommand(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: x\n")
    before = _cli("--log-format", "json", "validate", str(bad), cwd=tmp_path)
    after = _cli("validate", str(bad), "--log-format", "json", "-q", cwd=tmp_path)
    for result in (before, after):
        assert result.returncode == 2
        events = [json.loads(line) for line in result.stderr.splitlines()]
        assert events and all(e["event"] == "error" for e in events)
        assert "required section 'source' is missing" in events[0]["message"]
    debug = _cli("validate", str(tmp_path / "nope"), "--debug", cwd=tmp_path)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_plan_json_prints_only_json_also_on_error_and_with_fix(write_spec, tmp_path):
    ok = write_spec(reduce="{method: median}")
    refused = write_spec("refused.yaml", reduce="{method: median}", chunks="{time: -1, y: 256, x: 256}",
                         cluster="{n_workers: 2, threads_per_worker: 1, memory_limit: 300MB}")
    result = _cli("plan", "--json", "--fix", str(ok), cwd=tmp_path)
    payload = json.loads(result.stdout)  # nothing but JSON on stdout
    assert payload["items"] == 8 and payload["fixes"] == [] and result.returncode == 0
    result = _cli("plan", str(refused), "--json", "--fix", cwd=tmp_path)
    payload = json.loads(result.stdout)
    if result.returncode == 3:  # refused: the fixes are part of the JSON, not YAML after it
        assert payload["budget"]["ok"] is False and isinstance(payload["fixes"], list)
    else:
        assert result.returncode == 0 and payload["budget"]["ok"] is True
    result = _cli("plan", "--json", str(tmp_path / "missing.yaml"), cwd=tmp_path)
    error = json.loads(result.stdout)
    assert result.returncode == 2 and error["error"]["type"] == "SpecError" and error["error"]["exit_code"] == 2
    both = _cli("plan", "--json", str(ok), str(tmp_path / "missing.yaml"), cwd=tmp_path)
    assert both.returncode == 2 and [("error" in p) for p in json.loads(both.stdout)] == [True, False]


def test_a_closed_stdout_ends_quietly(write_spec, tmp_path):
    spec = write_spec(reduce="{method: median}")
    proc = subprocess.Popen([*RASTERFLOW, "plan", str(spec)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before anything is written (as `| head -0`)
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=120) == 141
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "internal error" not in stderr


def test_nan_bounds_and_nul_bytes_are_invalid_specs_with_the_field(write_spec, tmp_path):
    text = write_spec().read_text()
    nan = tmp_path / "nan.yaml"
    lines = [line if not line.startswith("  bounds:") else "  bounds: [.nan, 1, 2, 3]" for line in text.splitlines()]
    nan.write_text("\n".join(lines) + "\n")
    result = _cli("validate", str(nan), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "grid.bounds: every bound must be a finite number" in result.stderr
    inf = tmp_path / "inf.yaml"
    inf.write_text(nan.read_text().replace("[.nan, 1, 2, 3]", "[0, 1, .inf, 3]"))
    assert _cli("validate", str(inf), cwd=tmp_path).returncode == 2
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(text.encode().replace(b"name: test-run", b"name: test\x00run"))
    result = _cli("validate", str(nul), cwd=tmp_path)
    assert result.returncode == 2 and "internal error" not in result.stderr
    assert f"{nul}:2:11: name: a NUL byte is not allowed" in result.stderr


def test_exit_codes_are_documented_in_the_readme():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for code in ("64", "75", "130", "143", "129", "141"):
        assert f"| {code} " in readme, code
    assert "rasterflow.run(" in readme and "RunResult" in readme
    assert np.all([name in rasterflow.__all__ for name in ("load_spec", "plan", "run", "RunResult")])


@pytest.mark.slow
def test_json_log_events_and_quiet(write_spec, tmp_path):
    spec = write_spec(reduce="{method: median}", output="out/j.tif")
    result = _cli("run", str(spec), "--log-format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # events go to stderr, one JSON object per line
    events = [json.loads(line) for line in result.stderr.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and {"plan", "progress"} <= set(kinds)
    assert all(e["spec"] == "test-run" and e["time"].endswith("Z") for e in events)
    done = events[-1]
    assert done["status"] == "ok" and done["exit_code"] == 0 and done["outputs"] == [str(tmp_path / "out" / "j.tif")]

    again = _cli("run", str(spec), "--log-format", "json", cwd=tmp_path)
    assert again.returncode == 2
    last = json.loads(again.stderr.splitlines()[-1])
    assert last["event"] == "error" and last["status"] == "invalid" and "already exists" in last["error"]

    quiet = _cli("run", str(spec), "-q", "--overwrite", cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stdout == "ok test-run\n" and quiet.stderr == "", quiet.stderr
