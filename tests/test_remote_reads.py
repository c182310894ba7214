"""Remote data for real (issue 9, the read side): the sample COGs over a loopback HTTP server with injected faults,
a fault-injecting proxy in front of ``rustac serve``, and an S3 API (moto's standalone server) on loopback.

Every case compares with the local-file run (bit for bit) or an independent NumPy reference (tests/reference.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from conftest import spec_text
from http_faults import Fault, fault_server, http_items
from s3_server import moto_server
from reference import assert_same, load_items, read_asset_stack, reduce_reference
from stac_servers import rustac_server

from rasterflow import retry
from rasterflow.cli import cli
from rasterflow.gdalenv import allowed_extensions, aws_endpoint_options, remote_read_options
from rasterflow.read.remote import ReadFailedError, vsi_path

FAST = "{attempts: 4, backoff: 0.05, max_delay: 1, timeout: 2}"


# ---- helpers ---------------------------------------------------------------------------------------------------


def _spec(sample, path: Path, catalog, *, output: str, source: str = "", reduce: str = "{method: median}") -> Path:
    """A spec over the sample; ``source`` lines go into the source section (e.g. ``retry: {...}``)."""
    text = spec_text(sample, catalog=str(catalog), reduce=reduce, output=output)
    if source:
        text = text.replace("  assets:", "".join(f"  {line}\n" for line in source.splitlines()) + "  assets:", 1)
    path.write_text(text)
    return path


def _run(spec: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["run", str(spec)])
    return result.exit_code, result.output + (result.stderr if result.stderr_bytes else "")


def _report(out: Path) -> dict:
    return json.loads(Path(str(out) + ".report.json").read_text())


def _ndvi(out: Path) -> np.ndarray:
    return xr.open_zarr(out)["ndvi"].values


def _rel(sample, item_index: int, asset: str) -> str:
    """The URL path of one sample file (as the fault server serves it)."""
    item = load_items(sample)[item_index]
    return "/" + Path(item["assets"][asset]["href"]).relative_to(sample.directory).as_posix()


@pytest.fixture(scope="module")
def local_result(sample, tmp_path_factory):
    """The local-file run of the median NDVI: what every remote run must reproduce bit for bit."""
    tmp = tmp_path_factory.mktemp("local-run")
    spec = _spec(sample, tmp / "local.yaml", sample.items_json, output="out/local.zarr")
    code, output = _run(spec)
    assert code == 0, output
    return _ndvi(tmp / "out" / "local.zarr")


def _reference_without(sample, missing: list[tuple[int, str]]) -> np.ndarray:
    """The NumPy median NDVI with the given (item index, asset) files treated as missing."""
    items = load_items(sample)
    stacks = {a: read_asset_stack(items, a) for a in ("red", "nir", "scl")}
    for index, asset in missing:
        stacks[asset][index] = np.nan
    drop = np.isin(stacks["scl"], (3, 8, 9, 10)) | np.isnan(stacks["scl"])
    red = np.where(drop, np.nan, stacks["red"])
    nir = np.where(drop, np.nan, stacks["nir"])
    with np.errstate(divide="ignore", invalid="ignore"):
        ndvi = ((nir - red) / (nir + red)).astype(np.float32)
    return reduce_reference(ndvi, "median")


# ---- the fault server itself ------------------------------------------------------------------------------------


def test_fault_server_serves_ranges_and_injects_faults_deterministically(sample):
    path = _rel(sample, 0, "red")
    data = (Path(sample.directory) / path.lstrip("/")).read_bytes()
    faults = [Fault("status", path=path, nth={2}, status=503, retry_after=3),
              Fault("status", path="*/nir.tif", fraction=0.3, seed=5, status=500)]
    with fault_server(sample.directory, faults=faults) as server:
        request = urllib.request.Request(server.url + path, headers={"Range": "bytes=10-19"})
        with urllib.request.urlopen(request) as answer:
            assert answer.status == 206 and answer.read() == data[10:20]
            assert answer.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(server.url + path)
        assert caught.value.code == 503 and caught.value.headers["Retry-After"] == "3"
        caught.value.close()  # an HTTPError holds its answer's socket
        with urllib.request.urlopen(server.url + path) as answer:  # the 3rd request: no fault
            assert answer.read() == data
        assert server.count(path) == 3 and server.statuses(path) == {206: 1, 503: 1, 200: 1}
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(server.url + "/nothing.tif")
        assert missing.value.code == 404
        missing.value.close()
    # the same seed picks the same requests, whatever the timing
    fired = [Fault("status", fraction=0.3, seed=5).fires("GET", "/x/nir.tif", n, False) for n in range(1, 201)]
    again = [Fault("status", fraction=0.3, seed=5).fires("GET", "/x/nir.tif", n, False) for n in range(1, 201)]
    assert fired == again and 35 < sum(fired) < 85


# ---- pure pieces ---------------------------------------------------------------------------------------------


def test_hrefs_map_to_gdal_paths_and_s3_endpoints_follow_boto_conventions():
    assert vsi_path("https://host/a/b.tif") == "/vsicurl/https://host/a/b.tif"
    assert vsi_path("s3://bucket/key/b.tif") == "/vsis3/bucket/key/b.tif"
    assert vsi_path("/vsis3/bucket/b.tif") == "/vsis3/bucket/b.tif"
    assert vsi_path("/data/b.tif") == "/data/b.tif"
    assert aws_endpoint_options({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}) == {
        "AWS_S3_ENDPOINT": "127.0.0.1:9000", "AWS_HTTPS": "NO", "AWS_VIRTUAL_HOSTING": "FALSE"}
    assert aws_endpoint_options({"AWS_ENDPOINT_URL": "http://x:1", "AWS_S3_ENDPOINT": "y:2"}) == {}
    options = remote_read_options(timeout=5, extensions=".tif", environ={"GDAL_HTTP_MULTIPLEX": "NO"})
    assert "GDAL_HTTP_MULTIPLEX" not in options  # the user's environment wins
    assert options["GDAL_DISABLE_READDIR_ON_OPEN"] == "EMPTY_DIR" and options["GDAL_HTTP_TIMEOUT"] == "5"
    assert options["CPL_VSIL_CURL_ALLOWED_EXTENSIONS"] == ".tif" and options["GDAL_HTTP_MAX_RETRY"] == "0"
    assert allowed_extensions(["https://h/a.tif?sig=1", "s3://b/c.TIF"]) == ".TIF,.tif"
    assert allowed_extensions(["https://h/download?id=3"]) is None


def test_read_statistics_merge_across_processes_and_the_quota_is_a_share_of_files():
    from rasterflow.errors import RunFailedError
    from rasterflow.read.policy import ReadPolicy, check_quota, summarize

    def failure(href: str, windows: int = 1) -> dict:
        return {"item_id": "i", "asset": "red", "href": href, "error": f"cannot open {href}: HTTP 404",
                "status": 404, "attempts": 1, "windows": windows}

    policy = ReadPolicy(on_read_error="nodata", max_failed_fraction=0.1)
    parts = [{"retries": {"a": 2}, "failed": {"x": failure("x")}},
             {"retries": {"a": 1, "b": 1}, "failed": {"x": failure("x", 2)}}]
    # "y" failed on a worker that was lost before its statistics were collected: only its event is left
    summary = summarize(parts, 20, policy, events=[failure("x"), {**failure("y"), "worker": "tcp://w:1"}])
    assert summary.retries == {"a": 3, "b": 1} and summary.total_retries == 4
    assert [(f.href, f.windows) for f in summary.failed] == [("x", 3), ("y", 1)]
    check_quota(summary)  # 2 of 20 = 10 %: not more than allowed
    over = summarize(parts, 19, policy, events=[failure("y")])
    with pytest.raises(RunFailedError, match=r"2 of 19 source files \(10.5%\) could not be read"):
        check_quota(over)
    assert summarize(parts, 19, ReadPolicy(on_read_error="fail")).exceeded()


# ---- the reader in this process: retries, GDAL's cached failure, classification -------------------------------


def _read_window(sample, catalog, tmp_path, policy):
    """Read the first 96 x 96 window of every item and asset in this process, under ``policy``."""
    from rasterflow.graph import read_jobs
    from rasterflow.planning import local_layout, make_plan
    from rasterflow.read import read_planes
    from rasterflow.commands import search
    from rasterflow.spec import load_spec

    loaded = load_spec(_spec(sample, tmp_path / f"read-{time.monotonic_ns()}.yaml", catalog, output="o.zarr"))
    items = search(loaded)
    plan = make_plan(loaded.spec, items=items, layout=local_layout(loaded.spec))
    job = dataclasses.replace(read_jobs(plan, slice(0, len(items)), (0, 96), (0, 96)), policy=policy)
    return read_planes(job, (0, 96), (0, 96))  # the task carries the policy (no process-wide state)


def test_a_failed_open_is_retried_past_gdal_s_cached_failure(sample, tmp_path):
    """GDAL's path (source.io.reader: gdal, and every remote read the concurrent path leaves to GDAL)."""
    from rasterflow.read.policy import ReadPolicy, collect

    local = _read_window(sample, sample.items_json, tmp_path, ReadPolicy())
    path = _rel(sample, 2, "red")
    with fault_server(sample.directory, faults=[Fault("status", path=path, nth={1}, status=503)]) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        once = ReadPolicy(retry=retry.RetryPolicy(attempts=1), run_id="once", io_reader="gdal")
        with pytest.raises(ReadFailedError, match="HTTP 503") as caught:
            _read_window(sample, catalog, tmp_path, once)
        assert path in str(caught.value) and caught.value.status == 503
        # GDAL remembers the failure: the same href fails again at once (another run, so rasterflow's own record
        # of the failure plays no part), without asking the server
        requests = server.count(path)
        with pytest.raises(ReadFailedError, match="HTTP 503"):
            _read_window(sample, catalog, tmp_path, ReadPolicy(retry=retry.RetryPolicy(attempts=1), run_id="again",
                                                               io_reader="gdal"))
        assert server.count(path) == requests
        # a retry clears that cached failure for this file only and reads it
        policy = ReadPolicy(retry=retry.RetryPolicy(attempts=3, backoff=0), run_id="retried", io_reader="gdal")
        planes = _read_window(sample, catalog, tmp_path, policy)
        assert server.count(path) > requests
    for remote, expected in zip(planes.raw, local.raw):
        np.testing.assert_array_equal(remote, expected)
    stats = collect("retried")
    assert stats["retries"] == {server.url + path: 1} and stats["failed"] == {}
    assert list(collect("once")["failed"]) == [server.url + path]
    collect("again")


def test_vsi_paths_as_hrefs_are_read_and_retried_like_urls(sample, tmp_path):
    from rasterflow.read.policy import ReadPolicy, collect

    local = _read_window(sample, sample.items_json, tmp_path, ReadPolicy())
    path = _rel(sample, 6, "scl")
    with fault_server(sample.directory, faults=[Fault("status", path=path, nth={1}, status=500)]) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json", rewrite=lambda href: "/vsicurl/" + href)
        planes = _read_window(sample, catalog, tmp_path, ReadPolicy(retry=retry.RetryPolicy(backoff=0), run_id="vsi"))
        assert server.statuses(path)[500] == 1
    for remote, expected in zip(planes.raw, local.raw):
        np.testing.assert_array_equal(remote, expected)
    assert collect("vsi")["retries"] == {"/vsicurl/" + server.url + path: 1}


def test_404_and_403_are_not_retried_and_a_stall_is(sample, tmp_path):
    from rasterflow.read.policy import ReadPolicy, collect

    red, nir, scl = _rel(sample, 1, "red"), _rel(sample, 1, "nir"), _rel(sample, 3, "scl")
    policy = ReadPolicy(retry=retry.RetryPolicy(attempts=4, backoff=0, timeout=1), run_id="kinds")
    with fault_server(sample.directory, faults=[Fault("status", path=red, always=True, status=404)]) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        with pytest.raises(ReadFailedError, match="HTTP 404") as caught:
            _read_window(sample, catalog, tmp_path, policy)
        assert server.url + red in str(caught.value) and "gave up" not in str(caught.value)
        assert server.count(red) == 1
    with fault_server(sample.directory, faults=[Fault("status", path=nir, always=True, status=403)]) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        with pytest.raises(ReadFailedError, match="HTTP 403"):
            _read_window(sample, catalog, tmp_path, policy)
        assert server.count(nir) == 1
    stall = [Fault("stall", path=scl, nth={1}, seconds=3)]
    with fault_server(sample.directory, faults=stall) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        _read_window(sample, catalog, tmp_path, policy)
        assert server.count(scl) >= 2
    assert collect("kinds")["retries"] == {server.url + scl: 1}


def test_a_file_that_is_not_a_raster_fails_without_a_retry_loop(sample, tmp_path):
    from rasterflow.read.policy import ReadPolicy

    served = tmp_path / "served"
    shutil.copytree(sample.directory, served)
    victim = served / _rel(sample, 0, "nir").lstrip("/")
    victim.write_bytes(b"this is not a GeoTIFF" * 2000)
    policy = ReadPolicy(retry=retry.RetryPolicy(attempts=5, backoff=0), run_id="corrupt")
    with fault_server(served) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        with pytest.raises(ReadFailedError, match="not a raster") as caught:
            _read_window(sample, catalog, tmp_path, policy)
        assert not caught.value.transient and caught.value.attempts <= 2
        # the concurrent reader's header request (not a TIFF: left to GDAL), then GDAL's two opens and two probes,
        # not five of each
        assert server.count(_rel(sample, 0, "nir")) <= 7


def test_hrefs_are_signed_right_before_opening_and_the_token_stays_out_of_messages(sample, tmp_path, monkeypatch):
    from rasterflow.read import signing
    from rasterflow.read.policy import ReadPolicy

    monkeypatch.setitem(signing.BUILTIN_SIGNERS, "test-signer", lambda: (lambda href: href + "?token=s3cr3t"))
    signing.get_signer.cache_clear()
    local = _read_window(sample, sample.items_json, tmp_path, ReadPolicy())
    unsigned = Fault("status", path="*", always=True, status=403, unless_query="token=s3cr3t")
    with fault_server(sample.directory, faults=[unsigned]) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        with pytest.raises(ReadFailedError, match="HTTP 403") as caught:  # without signing: refused
            _read_window(sample, catalog, tmp_path, ReadPolicy(run_id="unsigned"))
        assert "token" not in str(caught.value)
        server.reset_counts()
        planes = _read_window(sample, catalog, tmp_path, ReadPolicy(sign="test-signer", run_id="signed"))
        assert server.statuses()[403] == 0 and server.count() > 0  # every signed request was served
    for remote, expected in zip(planes.raw, local.raw):
        np.testing.assert_array_equal(remote, expected)
    # a missing file under a signer: the message names the unsigned href only
    missing = Fault("status", path=_rel(sample, 0, "scl"), always=True, status=404)
    with fault_server(sample.directory, faults=[missing]) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        with pytest.raises(ReadFailedError, match="HTTP 404") as caught:
            _read_window(sample, catalog, tmp_path, ReadPolicy(sign="test-signer", run_id="signed-404"))
        assert server.url + _rel(sample, 0, "scl") in str(caught.value) and "s3cr3t" not in str(caught.value)
    signing.get_signer.cache_clear()


def test_unknown_or_uninstalled_signers_and_a_quota_without_nodata_are_clear_errors(sample, tmp_path, monkeypatch):
    from rasterflow.errors import RunFailedError, SpecError
    from rasterflow.read.policy import ReadPolicy, read_monitor
    from rasterflow.spec import load_spec

    with pytest.raises(RunFailedError, match="no signer called 'nope'; available: .*planetary-computer"):
        with read_monitor(None, ReadPolicy(sign="nope"), []):
            pass
    try:
        import planetary_computer  # noqa: F401
    except ImportError:
        with pytest.raises(RunFailedError, match="pip install 'planetary-computer"):
            with read_monitor(None, ReadPolicy(sign="planetary-computer"), []):
                pass
    # a signer from a package's entry point is loaded by name (nothing of the spec is evaluated)
    from importlib.metadata import EntryPoint

    from rasterflow.read import signing

    signing.get_signer.cache_clear()
    entry = EntryPoint(name="upper", value="builtins:str.upper", group=signing.ENTRY_POINT_GROUP)
    monkeypatch.setattr(signing, "_entry_points", lambda: {"upper": entry})
    assert signing.get_signer("upper")("abc") == "ABC" and "upper" in signing.available_signers()
    signing.get_signer.cache_clear()
    spec = _spec(sample, tmp_path / "bad.yaml", sample.items_json, output="o.zarr", source="max_failed_fraction: 0.1")
    with pytest.raises(SpecError, match=r"bad.yaml:\d+:\d+: source.max_failed_fraction: applies only with "
                                        r"on_read_error: nodata"):
        load_spec(spec)


# ---- whole runs on a LocalCluster: bit for bit, failures named, the nodata policy -------------------------------


@pytest.mark.slow
def test_transient_faults_on_cog_reads_are_retried_and_the_output_is_bit_for_bit(sample, tmp_path, local_result):
    faults = [Fault("status", path=_rel(sample, 4, "red"), nth={1}, status=503),  # the first open of a file
              Fault("status", path="*/red.tif", fraction=0.15, seed=1, status=503),
              Fault("status", path="*/scl.tif", fraction=0.1, seed=3, status=500),
              Fault("reset", path="*/nir.tif", fraction=0.1, seed=2),
              Fault("truncate", path="*/nir.tif", fraction=0.05, seed=4, ranged_only=True)]  # reset mid-body
    with fault_server(sample.directory, faults=faults) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        spec = _spec(sample, tmp_path / "http.yaml", catalog, output="out/http.zarr", source=f"retry: {FAST}")
        code, output = _run(spec)
        statuses = server.statuses()
    assert code == 0, output
    assert statuses[503] and statuses[500] and statuses["reset"] and statuses["truncate"], statuses  # they fired
    np.testing.assert_array_equal(_ndvi(tmp_path / "out" / "http.zarr"), local_result)
    reads = _report(tmp_path / "out" / "http.zarr")["reads"]
    assert reads["failed"] == [] and reads["total_retries"] >= 1 and reads["files"] == 24
    assert server.url + _rel(sample, 4, "red") in reads["retries"]
    assert f"reads: {reads['total_retries']} retries" in output
    options = _report(tmp_path / "out" / "http.zarr")["gdal_options"]["reads"]
    assert options["GDAL_DISABLE_READDIR_ON_OPEN"] == "EMPTY_DIR" and options["GDAL_HTTP_MAX_RETRY"] == "0"


@pytest.mark.slow
def test_a_persistent_503_fails_the_run_naming_the_href_and_the_status(sample, tmp_path):
    path = _rel(sample, 5, "red")
    with fault_server(sample.directory, faults=[Fault("status", path=path, always=True, status=503)]) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        spec = _spec(sample, tmp_path / "s.yaml", catalog, output="out/r.zarr",
                     source="retry: {attempts: 3, backoff: 0.05}")
        code, output = _run(spec)
        assert server.count(path) >= 3  # it was retried
    assert code == 1, output
    item_id = load_items(sample)[5]["id"]
    assert f"item {item_id!r} asset 'red'" in output and server.url + path in output and "HTTP 503" in output
    assert "Traceback" not in output
    report = _report(tmp_path / "out" / "r.zarr")
    assert report["status"] == "failed" and "HTTP 503" in report["error"]
    [failed] = report["reads"]["failed"]
    assert failed["href"] == server.url + path and failed["status"] == 503 and failed["attempts"] == 3


@pytest.mark.slow
def test_a_404_is_never_a_silent_success(sample, tmp_path):
    path = _rel(sample, 6, "nir")
    with fault_server(sample.directory, faults=[Fault("status", path=path, always=True, status=404)]) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        code, output = _run(_spec(sample, tmp_path / "s.yaml", catalog, output="out/r.zarr"))
    assert code == 1, output
    assert server.url + path in output and "HTTP 404" in output
    [failed] = _report(tmp_path / "out" / "r.zarr")["reads"]["failed"]
    assert failed["status"] == 404 and failed["attempts"] == 1  # never retried


@pytest.mark.slow
def test_nodata_policy_within_the_quota_treats_the_file_as_missing(sample, tmp_path):
    index, path = 3, _rel(sample, 3, "red")
    with fault_server(sample.directory, faults=[Fault("status", path=path, always=True, status=404)]) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        spec = _spec(sample, tmp_path / "s.yaml", catalog, output="out/r.zarr",
                     source="on_read_error: nodata\nmax_failed_fraction: 0.05")
        code, output = _run(spec)
    assert code == 0, output
    assert "reads: 1 of 24 source files (4.2%) could not be read and treated as missing" in output
    assert server.url + path in output
    actual = _ndvi(tmp_path / "out" / "r.zarr")
    assert_same(actual, _reference_without(sample, [(index, "red")]))
    # and the hole is real: the result differs from the complete one where that date was the median's
    assert not np.array_equal(actual, _reference_without(sample, []), equal_nan=True)
    reads = _report(tmp_path / "out" / "r.zarr")["reads"]
    assert reads["failed_count"] == 1 and reads["failed"][0]["item_id"] == load_items(sample)[index]["id"]


@pytest.mark.slow
def test_nodata_policy_over_the_quota_fails_the_run(sample, tmp_path):
    paths = [_rel(sample, 1, "red"), _rel(sample, 7, "scl")]
    faults = [Fault("status", path=p, always=True, status=404) for p in paths]
    with fault_server(sample.directory, faults=faults) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        spec = _spec(sample, tmp_path / "s.yaml", catalog, output="out/r.zarr",
                     source="on_read_error: nodata\nmax_failed_fraction: 0.05")
        code, output = _run(spec)
    assert code == 1, output
    assert "2 of 24 source files (8.3%) could not be read, more than source.max_failed_fraction (0.05)" in output
    assert all(server.url + p in output for p in paths)
    report = _report(tmp_path / "out" / "r.zarr")
    assert report["status"] == "failed" and report["reads"]["failed_count"] == 2
    assert not (tmp_path / "out" / "r.zarr").exists()  # stopped before the writer committed a holey output


# ---- the STAC API: a fault-injecting proxy in front of rustac serve ------------------------------------------


@pytest.fixture(scope="module")
def rustac_url(sample):
    with rustac_server(sample.collection_json, sample.items_ndjson) as url:
        yield url.rstrip("/")


@pytest.mark.server
def test_stac_api_faults_on_landing_page_search_and_second_page_are_retried(sample, rustac_url):
    from rasterflow.catalog import StacQuery, search_items

    faults = [Fault("status", path="/", nth={1}, status=502),
              Fault("status", path="/search", method="POST", nth={1}, status=503),
              Fault("reset", path="/search", nth={2}),
              Fault("status", path="/search", nth={4}, status=429, retry_after=1),  # a later page
              Fault("status", path="/search", nth={5}, status=500)]
    query = StacQuery(catalog="", collections=("sentinel-2-l2a-sample",), bbox=None, datetime=None)
    with fault_server(upstream=rustac_url, faults=faults) as proxy:
        with retry.using(retry.RetryPolicy(backoff=0.05)):
            started = time.monotonic()
            items = search_items(dataclasses.replace(query, catalog=proxy.url + "/"), page_size=3)
            waited = time.monotonic() - started
        assert proxy.statuses("/search")[200] >= 3  # three pages
        assert proxy.statuses("/search")[429] == 1 and waited >= 1.0  # Retry-After: 1 was honoured
    assert [i["id"] for i in items] == list(sample.item_ids)
    with fault_server(upstream=rustac_url, faults=[Fault("status", path="/search", always=True, status=503)]) as proxy:
        with retry.using(retry.RetryPolicy(attempts=3, backoff=0.05)):
            with pytest.raises(Exception, match="HTTP 503"):
                search_items(dataclasses.replace(query, catalog=proxy.url + "/"))
        assert proxy.count("/search") == 3


@pytest.mark.slow
@pytest.mark.server
def test_a_run_through_a_flaky_stac_api_equals_the_local_run(sample, tmp_path, rustac_url, local_result):
    faults = [Fault("status", path="/", nth={1}, status=503),
              Fault("status", path="/search", nth={1}, status=503),
              Fault("reset", path="/search", nth={2})]
    with fault_server(upstream=rustac_url, faults=faults) as proxy:
        spec = _spec(sample, tmp_path / "api.yaml", proxy.url + "/", output="out/api.zarr",
                     source=f"retry: {FAST}")
        code, output = _run(spec)
        assert proxy.statuses("/search")[503] == 1 and proxy.statuses("/search")["reset"] == 1
    assert code == 0, output
    np.testing.assert_array_equal(_ndvi(tmp_path / "out" / "api.zarr"), local_result)


# ---- S3: moto's standalone server on loopback ---------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_sample(sample, tmp_path_factory):
    """moto_server on a free port with the sample COGs in bucket ``cogs``; yields (endpoint, items file)."""
    import boto3

    with moto_server() as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
        s3.create_bucket(Bucket="cogs")
        for item in load_items(sample):
            for asset in item["assets"].values():
                href = Path(asset["href"])
                if href.suffix == ".tif":
                    s3.upload_file(str(href), "cogs", href.relative_to(sample.directory).as_posix())
        tmp = tmp_path_factory.mktemp("s3")
        items = json.loads(Path(sample.items_json).read_text())
        for item in items["features"]:
            for asset in item["assets"].values():
                if asset["href"].endswith(".tif"):
                    asset["href"] = "s3://cogs/" + Path(asset["href"]).relative_to(sample.directory).as_posix()
        (tmp / "items.json").write_text(json.dumps(items))
        yield endpoint.removeprefix("http://"), tmp / "items.json"


@pytest.mark.slow
def test_s3_sources_read_through_an_s3_api_equal_the_local_run(sample, tmp_path, s3_sample, local_result,
                                                             monkeypatch):
    endpoint, catalog = s3_sample
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_S3_ENDPOINT", endpoint)
    monkeypatch.setenv("AWS_HTTPS", "NO")
    monkeypatch.setenv("AWS_VIRTUAL_HOSTING", "FALSE")
    code, output = _run(_spec(sample, tmp_path / "s3.yaml", catalog, output="out/s3.zarr"))
    assert code == 0, output
    np.testing.assert_array_equal(_ndvi(tmp_path / "out" / "s3.zarr"), local_result)
    report = _report(tmp_path / "out" / "s3.zarr")
    assert report["gdal_options"]["aws_env"]["AWS_S3_ENDPOINT"] == endpoint
    assert report["gdal_options"]["aws_env"]["AWS_SECRET_ACCESS_KEY"] == "(set)"  # never the secret itself
    # a missing key is a 404 naming the s3 href (never retried), not a hole
    from rasterflow.read.policy import ReadPolicy

    items = json.loads(Path(catalog).read_text())
    items["features"][0]["assets"]["red"]["href"] = "s3://cogs/missing/red.tif"
    (tmp_path / "missing.json").write_text(json.dumps(items))
    with pytest.raises(ReadFailedError, match="HTTP 404") as caught:
        _read_window(sample, tmp_path / "missing.json", tmp_path, ReadPolicy(run_id="s3-missing"))
    assert "s3://cogs/missing/red.tif" in str(caught.value) and caught.value.attempts == 1


# ---- rasterflow profile reads as the run would ---------------------------------------------------------------


def test_profile_reads_with_the_specs_read_policy(sample, tmp_path):
    path = _rel(sample, 3, "red")
    with fault_server(sample.directory, faults=[Fault("status", path=path, always=True, status=404)]) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        outcomes = {}
        for policy in ("fail", "nodata"):
            spec = _spec(sample, tmp_path / f"{policy}.yaml", catalog, output=f"out/{policy}.zarr",
                         source="on_read_error: fail" if policy == "fail"
                         else "on_read_error: nodata\nmax_failed_fraction: 0.5")
            text = spec.read_text().replace("chunks: {time: -1, y: 96, x: 96}", "chunks: {time: -1, y: -1, x: -1}")
            spec.write_text(text)  # one chunk: the profiled task reads every file, the missing one too
            result = CliRunner().invoke(cli, ["profile", str(spec), "--no-memray"])
            outcomes[policy] = (result.exit_code, result.output + (result.stderr if result.stderr_bytes else ""))
    code, output = outcomes["fail"]
    assert code != 0 and server.url + path in output and "404" in output, output
    code, output = outcomes["nodata"]
    assert code == 0, output  # the spec's on_read_error: nodata, as a run would read
    assert "measured, tracemalloc" in output
