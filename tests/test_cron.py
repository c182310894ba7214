"""A crontab-like scenario run as processes: a nightly spec with variables, a relative window, a dated output and
``if_exists: skip``; then variables and dated paths on their own.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr

from conftest import spec_text
from rasterflow.spec import load_spec
from reference import assert_same, load_items, masked_ndvi, reduce_reference

RASTERFLOW = [sys.executable, "-m", "rasterflow"]


def _mtimes(directory: Path) -> dict[str, int]:
    """Every file's mtime, but the lock's (each run takes the lock, and writes its holder record into it)."""
    return {str(p.relative_to(directory)): p.stat().st_mtime_ns for p in directory.rglob("*")
            if p.is_file() and not p.name.endswith(".rasterflow-lock")}


def _nightly(sample, tmp_path: Path) -> Path:
    text = spec_text(sample, catalog="${CATALOG}", reduce="{method: median}",
                     output='"${OUT_DIR}/ndvi_{end:%Y-%m-%d}.zarr", if_exists: skip',
                     cluster="{n_workers: 1, threads_per_worker: 1, memory_limit: 1GB}")
    # a relative window ending now that reaches back to the sample's 2024 summer
    text = text.replace("datetime: 2024-06-01/2024-08-31", "datetime: P5000D")
    spec = tmp_path / "nightly.yaml"
    spec.write_text(text)
    return spec


@pytest.mark.slow
def test_nightly_twice_is_up_to_date_then_a_new_item_recomputes(sample, tmp_path):
    catalog = tmp_path / "items.json"
    items = json.loads(Path(sample.items_json).read_text())
    catalog.write_text(json.dumps(items))
    spec = _nightly(sample, tmp_path)
    out_dir = tmp_path / "data"
    env = {**os.environ, "CATALOG": str(catalog)}

    def night(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([*RASTERFLOW, "run", str(spec), *extra], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=180)

    first = night("--var", f"OUT_DIR={out_dir}")
    assert first.returncode == 0, first.stderr
    outputs = list(out_dir.glob("ndvi_*.zarr"))
    assert [p.name for p in outputs] == [f"ndvi_{dt.datetime.now(dt.timezone.utc):%Y-%m-%d}.zarr"]
    out = outputs[0]
    before = _mtimes(out_dir)

    env["OUT_DIR"] = str(out_dir)  # the same value from the environment this time: the same spec
    second = night()
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stdout
    assert _mtimes(out_dir) == before  # nothing rewritten, the report included
    entry = json.loads((tmp_path / ".rasterflow" / "run_results.json").read_text())["results"][0]
    assert entry["status"] == "up_to_date" and entry["exit_code"] == 0 and entry["outputs"] == [str(out)]

    # a new scene arrives (a new id, inside the window): the next night recomputes
    extra = copy.deepcopy(items["features"][0])
    extra["id"] = extra["id"] + "-reprocessed"
    extra["properties"]["datetime"] = "2024-07-30T10:00:00Z"
    items["features"].append(extra)
    catalog.write_text(json.dumps(items))
    third = night()
    assert third.returncode == 0, third.stderr
    assert "up to date" not in third.stdout
    report = json.loads(Path(str(out) + ".report.json").read_text())
    assert report["status"] == "ok" and extra["id"] in report["item_ids"]
    assert _mtimes(out_dir)[str(out.relative_to(out_dir)) + ".report.json"] != before[out.name + ".report.json"]
    used = [f for f in items["features"] if f["id"] in report["item_ids"]]
    assert len(used) == 9
    by_id = {i["id"]: i for i in load_items(sample)}
    series_items = [by_id.get(f["id"], f) for f in used]
    assert_same(xr.open_zarr(out)["ndvi"].values, reduce_reference(masked_ndvi(series_items), "median"))


def test_variables_keep_file_and_line_and_are_typed(tmp_path, write_spec):
    spec = write_spec(reduce="{method: median}")
    text = spec.read_text().replace("  resolution: 10", "  resolution: ${RES:-10}")
    spec.write_text(text)
    assert load_spec(spec, environ={}).spec.grid.resolution == 10.0
    assert load_spec(spec, variables={"RES": "20"}).spec.grid.resolution == 20.0
    line = text.splitlines().index("  resolution: ${RES:-10}") + 1
    with pytest.raises(Exception) as caught:
        load_spec(spec, variables={"RES": "abc"})
    assert f"{spec}:{line}:3: grid.resolution: must be a number (got 'abc')" in str(caught.value)
    spec.write_text(text.replace("${RES:-10}", "${RES}"))
    result = subprocess.run([*RASTERFLOW, "validate", str(spec)], capture_output=True, text=True,
                            env={k: v for k, v in os.environ.items() if k != "RES"})
    assert result.returncode == 2 and f"{spec}:{line}:15: grid.resolution: variable RES is not set" in result.stderr
    ok = subprocess.run([*RASTERFLOW, "validate", str(spec), "--var", "RES=10"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_dated_output_paths_are_checked(tmp_path, write_spec):
    from rasterflow.errors import SpecError
    from rasterflow.outputs import render_output_path

    start, end = dt.datetime(2024, 6, 1, tzinfo=dt.timezone.utc), dt.datetime(2024, 8, 31, 23, 59,
                                                                              tzinfo=dt.timezone.utc)
    assert render_output_path("o/{start:%Y%m}_{end}.tif", start, end) == "o/202406_2024-08-31.tif"
    assert render_output_path("o/{{literal}}.zarr", start, end) == "o/{literal}.zarr"
    for bad in ("o/{start.year}.tif", "o/{name}.tif", "o/{start!r}.tif", "o/{start"):
        with pytest.raises(SpecError):
            render_output_path(bad, start, end)
    with pytest.raises(SpecError, match="no start"):
        render_output_path("o/{start}.tif", None, end)


@pytest.mark.slow
def test_skip_with_cogs_per_month(write_spec, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from rasterflow.cli import cli

    monkeypatch.chdir(tmp_path)
    spec = write_spec(reduce="{method: median, period: month}", output="out/m.tif, if_exists: skip")
    first = CliRunner().invoke(cli, ["run", str(spec)])
    assert first.exit_code == 0, first.output
    files = sorted((tmp_path / "out").glob("m_*.tif"))
    assert len(files) >= 3
    before = _mtimes(tmp_path / "out")
    second = CliRunner().invoke(cli, ["run", str(spec)])
    assert second.exit_code == 0 and "up to date" in second.output, second.output
    assert _mtimes(tmp_path / "out") == before
    files[1].unlink()  # one month's file is gone: not up to date any more, all of them are written again
    third = CliRunner().invoke(cli, ["run", str(spec)])
    assert third.exit_code == 0 and "up to date" not in third.output, third.output
    assert files[1].exists() and files[0].stat().st_mtime_ns != before[files[0].name]


@pytest.mark.slow
def test_update_recomputes_only_the_changed_month(sample, tmp_path, monkeypatch):
    from click.testing import CliRunner

    import rasterio
    from rasterflow.cli import cli
    from reference import months

    monkeypatch.chdir(tmp_path)
    items = json.loads(Path(sample.items_json).read_text())
    catalog = tmp_path / "items.json"
    catalog.write_text(json.dumps(items))
    spec = tmp_path / "u.yaml"
    spec.write_text(spec_text(sample, catalog=str(catalog), reduce="{method: median, period: month}",
                              output="out/u.tif, if_exists: update"))
    first = CliRunner().invoke(cli, ["run", str(spec)])
    assert first.exit_code == 0, first.output
    labels = sorted(set(months(load_items(sample))))
    files = {label: tmp_path / "out" / f"u_{label}.tif" for label in labels}
    assert len(files) >= 3 and all(f.exists() for f in files.values())
    before = {label: f.stat().st_mtime_ns for label, f in files.items()}

    # a reprocessed scene arrives for one month only
    changed = labels[1]
    template = next(f for f in items["features"] if f["properties"]["datetime"][:7] == changed)
    extra = copy.deepcopy(template)
    extra["id"] += "-reprocessed"
    extra["properties"]["datetime"] = template["properties"]["datetime"][:8] + "28T10:00:00Z"
    items["features"].append(extra)
    catalog.write_text(json.dumps(items))
    second = CliRunner().invoke(cli, ["run", str(spec)])
    assert second.exit_code == 0, second.output
    assert "update: recomputing 1 file(s)" in second.output
    after = {label: f.stat().st_mtime_ns for label, f in files.items()}
    assert [label for label in labels if after[label] != before[label]] == [changed]
    report = json.loads((tmp_path / "out" / "u.tif.report.json").read_text())
    assert sorted(o["path"] for o in report["outputs"]) == sorted(map(str, files.values()))
    # every month against the reference over the new item set
    by_id = {i["id"]: i for i in load_items(sample)}
    now_items = [by_id.get(f["id"], {**f, "assets": by_id[template["id"]]["assets"]}) for f in items["features"]]
    series, month_of = masked_ndvi(now_items), [i["properties"]["datetime"][:7] for i in now_items]
    for label, path in files.items():
        chosen = [k for k, m in enumerate(month_of) if m == label]
        with rasterio.open(path) as src:
            assert_same(src.read(1), reduce_reference(series[chosen], "median"))
    third = CliRunner().invoke(cli, ["run", str(spec)])
    assert third.exit_code == 0 and "up to date" in third.output, third.output


def test_update_needs_cogs_per_period(write_spec):
    from rasterflow.errors import SpecError

    zarr = write_spec(reduce="{method: median, period: month}", output="out/u.zarr, if_exists: update")
    with pytest.raises(SpecError, match="output.if_exists: update recomputes single periods"):
        load_spec(zarr)
    no_period = write_spec("p.yaml", reduce="{method: median}", output="out/u.tif, if_exists: update")
    with pytest.raises(SpecError, match="needs a COG output"):
        load_spec(no_period)
    both = write_spec("b.yaml", reduce="{method: median}", output="out/u.tif, overwrite: true, if_exists: skip")
    with pytest.raises(SpecError, match="output.if_exists: contradicts overwrite: true"):
        load_spec(both)
    assert load_spec(write_spec("ok.yaml", reduce="{method: median, period: month}",
                                output="out/u.tif, if_exists: update")).spec.output.policy == "update"
