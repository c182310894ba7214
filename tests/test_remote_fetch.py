"""The concurrent remote reader (issue 27): COGs written by rasterio, served over loopback HTTP (tests/http_faults.py),
an S3 API (moto), Azurite and a GCS emulator (fake-gcs-server), read by :mod:`rasterflow.read.prefetch` and
compared bit for bit with GDAL's read of the same local file; requests in flight bounded; each tile fetched once per
task; every fault ends as source.retry and on_read_error say; the run report's I/O counts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import rasterio
import rasterio.shutil
from affine import Affine
from rasterio.windows import Window

from http_faults import Fault, fault_server

from rasterflow import retry
from rasterflow.planning import GridPlan
from rasterflow.read import prefetch
from rasterflow.read.policy import LONGEST_WAITS, ReadPolicy, collect, merge_io
from rasterflow.read.prefetch import task_reads
from rasterflow.read.remote import ReadFailedError
from rasterflow.sources import AssetRead

RES = 10.0
ORIGIN = (500000.0, 5800000.0)  # the files' top-left corner
HEIGHT, WIDTH = 700, 900  # not multiples of the tiles: edge tiles
FAST = retry.RetryPolicy(attempts=4, backoff=0.01, max_delay=0.05, timeout=2)

# name -> (dtype, compress, predictor, tile, nodata, sparse)
FILES = {
    "u16_zstd_pred2": ("uint16", "zstd", 2, 256, 0, False),
    "u16_deflate_pred2": ("uint16", "deflate", 2, 256, None, False),
    "i16_lzw": ("int16", "lzw", 1, 128, -9999, False),
    "u8_lzw": ("uint8", "lzw", 1, 256, None, False),
    "u8_deflate_pred2": ("uint8", "deflate", 2, 512, 255, False),
    "f32_zstd_pred3": ("float32", "zstd", 3, 256, None, False),
    "u16_none": ("uint16", "none", 1, 256, None, False),
    "u16_sparse_nodata": ("uint16", "zstd", 2, 256, 7, True),
    "u8_sparse": ("uint8", "deflate", 1, 256, None, True),
}


def _values(dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    smooth = (np.sin(y / 37.0) + np.cos(x / 23.0)) * 0.5 + 1.0  # compressible, as imagery is
    noise = rng.normal(0, 0.05, (HEIGHT, WIDTH))
    if dtype == "float32":
        return (smooth + noise).astype(np.float32)
    top = np.iinfo(dtype).max if dtype != "int16" else 20000
    return np.clip((smooth + noise) * top / 2.5, 1, top - 1).astype(dtype)


def _write(path: Path, dtype: str, compress: str, predictor: int, tile: int, nodata, sparse: bool, seed: int) -> None:
    profile = dict(driver="GTiff", width=WIDTH, height=HEIGHT, count=1, dtype=dtype, crs="EPSG:32633",
                   transform=Affine(RES, 0.0, ORIGIN[0], 0.0, -RES, ORIGIN[1]), tiled=True, blockxsize=tile,
                   blockysize=tile, compress=compress, predictor=predictor, nodata=nodata)
    if sparse:
        profile["sparse_ok"] = True
    values = _values(dtype, seed)
    with rasterio.open(path, "w", **profile) as dst:
        if sparse:  # only the top-left and bottom-right quarters: the other tiles are absent from the file
            dst.write(values[: HEIGHT // 2, : WIDTH // 2], 1, window=Window(0, 0, WIDTH // 2, HEIGHT // 2))
            dst.write(values[HEIGHT // 2:, WIDTH // 2:], 1,
                      window=Window(WIDTH // 2, HEIGHT // 2, WIDTH - WIDTH // 2, HEIGHT - HEIGHT // 2))
        else:
            dst.write(values, 1)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Every kind of file of :data:`FILES` (GTiff: the header at the end of the file, after the tiles, for all but
    one; the COG driver puts it in front) plus a COG."""
    root = tmp_path_factory.mktemp("remote-files")
    for seed, (name, (dtype, compress, predictor, tile, nodata, sparse)) in enumerate(FILES.items()):
        _write(root / f"{name}.tif", dtype, compress, predictor, tile, nodata, sparse, seed)
    with rasterio.open(root / "u16_zstd_pred2.tif") as src:
        rasterio.shutil.copy(src, root / "cog.tif", driver="COG", compress="zstd", predictor=2, blocksize=256)
    return root


GRID = GridPlan(crs="EPSG:32633", resolution=RES,
                bounds=(ORIGIN[0] - 50 * RES, ORIGIN[1] - (HEIGHT + 30) * RES, ORIGIN[0] + (WIDTH + 20) * RES,
                        ORIGIN[1] + 40 * RES),
                shape=(HEIGHT + 70, WIDTH + 70))
"""An output grid a little larger than the files: windows at its edges hold pixels no file covers."""
ROW0, COL0 = 40, 50  # where the files' first pixel lies on GRID


def _read(name: str, href: str, *, declared_nodata=None) -> AssetRead:
    return AssetRead(item_id=f"item-{name}", name="band", key="band", href=href, data_type=None,
                     nodata=declared_nodata, scale=1.0, offset=0.0, crs="EPSG:32633", transform=None, shape=None,
                     band_count=None, footprint=None, direct=True)


def _windows(step_rows: int, step_cols: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Windows covering GRID, column by column (as a fused task's sub-blocks), cutting the files' tiles."""
    return [((top, min(top + step_rows, GRID.shape[0])), (left, min(left + step_cols, GRID.shape[1])))
            for left in range(0, GRID.shape[1], step_cols) for top in range(0, GRID.shape[0], step_rows)]


def _gdal_window(path: Path, rows: tuple[int, int], cols: tuple[int, int], dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """GDAL's read of the file's part of a GRID window (zeros elsewhere) and where the file covers it."""
    out = np.zeros((rows[1] - rows[0], cols[1] - cols[0]), dtype=dtype)
    covered = np.zeros(out.shape, dtype=bool)
    r0, r1 = max(rows[0], ROW0), min(rows[1], ROW0 + HEIGHT)
    c0, c1 = max(cols[0], COL0), min(cols[1], COL0 + WIDTH)
    if r0 < r1 and c0 < c1:
        with rasterio.open(path) as src:
            out[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]] = src.read(
                1, window=Window(c0 - COL0, r0 - ROW0, c1 - c0, r1 - r0))
        covered[r0 - rows[0]:r1 - rows[0], c0 - cols[0]:c1 - cols[0]] = True
    return out, covered


def _read_all(reads: list[AssetRead], windows, policy: ReadPolicy, dtypes: list[str]):
    """Every window of every read through one task's concurrent reads -> ``{(read index, window): (values,
    covered)}`` and the file nodata each read reported."""
    results, nodata = {}, {}
    with task_reads([[read] for read in reads], GRID, windows, policy) as session:
        assert session is not None
        for rows, cols in windows:
            for i, read in enumerate(reads):
                out = np.zeros((rows[1] - rows[0], cols[1] - cols[0]), dtype=dtypes[i])
                covered = np.zeros(out.shape, dtype=bool)
                handled, file_nodata = session.read(read, rows, cols, out, covered)
                assert handled, f"{read.href} was left to GDAL"
                results[(i, rows, cols)] = (out, covered)
                nodata[i] = file_nodata
    return results, nodata


@pytest.fixture(autouse=True)
def _fresh_headers():
    prefetch.clear_headers()
    yield
    prefetch.clear_headers()


# ---- bit for bit against GDAL ------------------------------------------------------------------------------------


def test_every_codec_predictor_dtype_edge_and_sparse_tile_equals_gdal_over_http(files):
    names = [*FILES, "cog"]
    dtypes = [FILES[n][0] if n in FILES else "uint16" for n in names]
    windows = _windows(300, 333)  # cuts tiles of every size; windows beyond the files' edges
    with fault_server(files) as server:
        reads = [_read(n, f"{server.url}/{n}.tif") for n in names]
        results, nodata = _read_all(reads, windows, ReadPolicy(retry=FAST, run_id="codecs"), dtypes)
        data_requests = [entry for entry in server.log if entry[2] and not entry[2].startswith("bytes=0-")]
    for i, name in enumerate(names):
        for rows, cols in windows:
            expected, covered = _gdal_window(files / f"{name}.tif", rows, cols, dtypes[i])
            got, got_covered = results[(i, rows, cols)]
            np.testing.assert_array_equal(got, expected, err_msg=f"{name} {rows} {cols}")
            np.testing.assert_array_equal(got_covered, covered)
        assert nodata[i] == (FILES[name][4] if name in FILES else 0)
    # the sparse files really had absent tiles (GDAL fills them with the nodata value, else 0, as read here)
    with rasterio.open(files / "u16_sparse_nodata.tif") as src:
        assert (src.read(1, window=Window(WIDTH - 10, 0, 10, 10)) == 7).all()
    assert data_requests, "no tile was fetched"
    collect("codecs")


def _equal_gdal_and_missing_is_404(files: Path, names: list[str], hrefs: list[str], run_id: str) -> None:
    """Every window of ``hrefs`` (the files ``names`` on an object store) equals GDAL's read of the local file; a
    missing object next to them is an HTTP 404 naming its href, never retried."""
    dtypes = [FILES[n][0] if n in FILES else "uint16" for n in names]
    windows = _windows(512, 512)
    reads = [_read(n, h) for n, h in zip(names, hrefs)]
    results, _ = _read_all(reads, windows, ReadPolicy(retry=FAST, run_id=run_id), dtypes)
    for i, name in enumerate(names):
        for rows, cols in windows:
            expected, _ = _gdal_window(files / f"{name}.tif", rows, cols, dtypes[i])
            np.testing.assert_array_equal(results[(i, rows, cols)][0], expected, err_msg=name)
    missing_href = hrefs[0].rsplit("/", 1)[0] + "/missing.tif"
    with pytest.raises(ReadFailedError, match="HTTP 404") as caught:
        _read_all([_read("missing", missing_href)], windows[:1],
                  ReadPolicy(retry=FAST, run_id=f"{run_id}-missing"), ["uint16"])
    assert missing_href in str(caught.value) and caught.value.attempts == 1


def test_s3_reads_through_moto_equal_gdal(files, monkeypatch):
    boto3 = pytest.importorskip("boto3")
    from s3_server import moto_server

    with moto_server() as endpoint:
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            monkeypatch.delenv(key)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="cogs")
        names = ["u16_zstd_pred2", "u8_lzw", "f32_zstd_pred3", "u16_sparse_nodata", "cog"]
        for name in names:
            s3.upload_file(str(files / f"{name}.tif"), "cogs", f"deep/path/{name}.tif")
        _equal_gdal_and_missing_is_404(files, names, [f"s3://cogs/deep/path/{n}.tif" for n in names], "s3")
        assert collect("s3-missing")["retries"] == {}
        io = collect("s3")["io"]
        assert io["header_reads"] == len(names) and io["requests"] > len(names)


def test_azure_reads_through_azurite_equal_gdal(files, monkeypatch):
    """``az://`` and ``abfs://container@account...`` through obstore's AzureStore against Azurite (Microsoft's
    emulator), set up from GDAL's /vsiaz/ variables; a missing blob is a 404 naming the href, never retried."""
    import obstore
    from obstore.store import AzureStore

    from azure_server import ACCOUNT, KEY, azurite, create_container
    from rasterflow.read.fetch import azure_config, azure_location, supported

    with azurite() as endpoint:
        for key in [k for k in os.environ if k.startswith("AZURE_")]:
            monkeypatch.delenv(key)
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                           f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
                           f"BlobEndpoint={endpoint};")
        config = azure_config()
        assert config == {"account_name": ACCOUNT, "endpoint": endpoint, "account_key": KEY}
        store = AzureStore("cogs", config=config, client_options={"allow_http": True})
        create_container(endpoint, "cogs")
        names = ["u16_zstd_pred2", "u8_lzw", "f32_zstd_pred3", "u16_sparse_nodata", "cog"]
        try:
            for name in names:
                obstore.put(store, f"deep/{name}.tif", (files / f"{name}.tif").read_bytes())
        except Exception as err:  # Azurite wants the container made first
            pytest.fail(f"could not upload to Azurite: {err}")
        hrefs = [f"az://cogs/deep/{n}.tif" if i % 2 else f"abfs://cogs@{ACCOUNT}.dfs.core.windows.net/deep/{n}.tif"
                 for i, n in enumerate(names)]
        assert all(supported(h) for h in hrefs) and azure_location(hrefs[0]) == ("cogs", "deep/u16_zstd_pred2.tif",
                                                                                 ACCOUNT)
        _equal_gdal_and_missing_is_404(files, names, hrefs, "az")
        io = collect("az")["io"]
        assert io["header_reads"] == len(names) and io["requests"] > len(names)


def test_azure_config_follows_gdal_variables():
    from rasterflow.read.fetch import azure_config

    assert azure_config({"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_NO_SIGN_REQUEST": "YES"}) == {
        "account_name": "acct", "skip_signature": True}
    assert azure_config({"AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_SAS_TOKEN": "?sv=1&sig=x"}) == {
        "account_name": "acct", "sas_key": "sv=1&sig=x"}
    assert azure_config({"AZURE_STORAGE_ACCOUNT": "a", "AZURE_STORAGE_ACCESS_KEY": "k"}, account="b") == {
        "account_name": "b", "account_key": "k"}


def _gcs_environment(monkeypatch, endpoint: str) -> None:
    """GDAL's /vsigs/ variables for the emulator: its endpoint, no signature (it checks none)."""
    for key in [k for k in os.environ if k.startswith(("GS_", "GOOGLE_", "CPL_GS_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("CPL_GS_ENDPOINT", endpoint + "/")
    monkeypatch.setenv("GS_NO_SIGN_REQUEST", "YES")


def test_gcs_missing_object_through_the_emulator_is_a_404_naming_the_href(monkeypatch):
    """``gs://`` through obstore's GCSStore, set up from GDAL's /vsigs/ variables, reaches fake-gcs-server: a
    missing object is an HTTP 404 naming the href, never retried."""
    from gcs_server import fake_gcs_server
    from rasterflow.read import fetch

    with fake_gcs_server("cogs", {}) as endpoint:
        _gcs_environment(monkeypatch, endpoint)
        assert fetch.gcs_config() == {"base_url": endpoint, "skip_signature": True}
        href = "gs://cogs/deep/missing.tif"
        assert fetch.supported(href)
        with pytest.raises(ReadFailedError, match="HTTP 404") as caught:
            _read_all([_read("missing", href)], _windows(512, 512)[:1], ReadPolicy(retry=FAST, run_id="gs-404"),
                      ["uint16"])
        assert href in str(caught.value) and caught.value.attempts == 1
        assert collect("gs-404")["retries"] == {}


def test_gcs_reads_through_fake_gcs_server_equal_gdal(files, monkeypatch):
    """``gs://`` through obstore's GCSStore against fake-gcs-server, set up from GDAL's /vsigs/ variables, equals
    GDAL's read of the local files; a missing object is a 404 naming the href, never retried."""
    from gcs_server import fake_gcs_server
    from rasterflow.read import fetch

    names = ["u16_zstd_pred2", "u8_lzw", "f32_zstd_pred3", "u16_sparse_nodata", "cog"]
    objects = {f"deep/path/{n}.tif": (files / f"{n}.tif").read_bytes() for n in names}
    with fake_gcs_server("cogs", objects) as endpoint:
        _gcs_environment(monkeypatch, endpoint)
        hrefs = [f"gs://cogs/deep/path/{n}.tif" for n in names]
        assert all(fetch.supported(h) for h in hrefs)
        _equal_gdal_and_missing_is_404(files, names, hrefs, "gs")
        assert collect("gs-missing")["retries"] == {}
        io = collect("gs")["io"]
        assert io["header_reads"] == len(names) and io["requests"] > len(names)


def test_gcs_config_follows_gdal_variables(tmp_path, monkeypatch):
    from rasterflow.read.fetch import gcs_config, supported

    home = str(tmp_path)  # no ~/.boto there
    assert gcs_config({"HOME": home}) == {}
    assert gcs_config({"GS_NO_SIGN_REQUEST": "YES", "CPL_GS_ENDPOINT": "http://127.0.0.1:9023/"}) == {
        "base_url": "http://127.0.0.1:9023", "skip_signature": True}
    assert gcs_config({"GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json", "HOME": home}) == {
        "application_credentials": "/keys/sa.json"}
    # no signature wins, as in GDAL: no credentials are looked for
    assert gcs_config({"GS_NO_SIGN_REQUEST": "yes", "GS_SECRET_ACCESS_KEY": "s", "GS_ACCESS_KEY_ID": "i"}) == {
        "skip_signature": True}
    # what only GDAL follows: the href stays with GDAL
    for gdal_only in ({"GS_SECRET_ACCESS_KEY": "s", "GS_ACCESS_KEY_ID": "i"}, {"GS_OAUTH2_REFRESH_TOKEN": "t"},
                      {"GS_USER_PROJECT": "p", "GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json"},
                      {"GS_OAUTH2_PRIVATE_KEY_FILE": "/keys/k.pem", "GS_OAUTH2_CLIENT_EMAIL": "a@b"},
                      {"CPL_GS_CREDENTIALS_FILE": "/keys/boto"}):
        assert gcs_config({**gdal_only, "HOME": home}) is None, gdal_only
    # HMAC keys win over the service account in GDAL; the service account over a private key
    assert gcs_config({"GS_SECRET_ACCESS_KEY": "s", "GS_ACCESS_KEY_ID": "i",
                       "GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json"}) is None
    assert gcs_config({"GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json", "GS_OAUTH2_PRIVATE_KEY": "k",
                       "GS_OAUTH2_CLIENT_EMAIL": "a@b"}) == {"application_credentials": "/keys/sa.json"}
    (tmp_path / ".boto").write_text("[Credentials]\ngs_access_key_id = i\n")
    assert gcs_config({"HOME": home}) is None
    (tmp_path / ".boto").unlink()
    # gs:// is read by the concurrent reader when obstore can follow the environment, else by GDAL
    for key in [k for k in os.environ if k.startswith(("GS_", "GOOGLE_", "CPL_GS_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HOME", home)
    assert supported("gs://bucket/key.tif")
    monkeypatch.setenv("GS_OAUTH2_REFRESH_TOKEN", "t")
    assert not supported("gs://bucket/key.tif")


# ---- requests: bounded in flight, coalesced, each tile once ------------------------------------------------------


def test_requests_in_flight_are_bounded_by_the_concurrency(files):
    names = list(FILES)
    dtypes = [FILES[n][0] for n in names]
    with fault_server(files, latency=0.05) as server:
        reads = [_read(n, f"{server.url}/{n}.tif") for n in names]
        _read_all(reads, _windows(256, 256), ReadPolicy(retry=FAST, run_id="c3", io_concurrency=3), dtypes)
        assert 2 <= server.in_flight_peak <= 3
        server.reset_counts()
        prefetch.clear_headers()
        _read_all(reads, _windows(256, 256), ReadPolicy(retry=FAST, run_id="c16", io_concurrency=16), dtypes)
        assert 3 < server.in_flight_peak <= 16  # the nine headers at once, then the tiles of several windows
    collect("c3")
    stats = collect("c16")["io"]
    assert stats["in_flight_peak"] <= 16 and stats["header_reads"] == len(names)


def test_each_tile_is_fetched_once_per_task_in_coalesced_requests(files):
    """Windows that cut the tiles (as sub-blocks do) still fetch every tile once; a whole-file window of a file
    whose tiles are contiguous is one request after the header."""
    name = "u16_zstd_pred2"
    import tifffile

    with tifffile.TiffFile(files / f"{name}.tif") as tif:
        page = tif.pages.first
        tile_bytes = sum(page.databytecounts)
    with fault_server(files) as server:
        read = _read(name, f"{server.url}/{name}.tif")
        _read_all([read], _windows(100, 90), ReadPolicy(retry=FAST, run_id="once"), ["uint16"])
        data = [(r, s) for _, _, r, s in server.log if not r.startswith("bytes=0-")]
        fetched = 0
        for spec, _ in data:
            start, end = (int(v) for v in spec[len("bytes="):].split("-"))
            fetched += end - start + 1
        # every tile once (plus the small gaps between tiles read through)
        assert tile_bytes <= fetched <= tile_bytes + 64 * 1024 * len(data)
        server.reset_counts()
        prefetch.clear_headers()
        whole = [((ROW0, ROW0 + HEIGHT), (COL0, COL0 + WIDTH))]
        _read_all([read], whole, ReadPolicy(retry=FAST, run_id="whole"), ["uint16"])
        assert server.count() == 2  # the header and one range of every tile (GTiff writes them in order)
    collect("once"), collect("whole")


@pytest.mark.parametrize("across", [True, False])
def test_sub_blocks_across_a_row_fetch_each_row_of_tiles_in_one_request(files, across):
    """Sub-blocks of one tile each over 2 x 3 tiles of a file: taken across each row of them (as a fused task over
    remote files takes them), a row of tiles is one request, each of its tiles held until its sub-block is decoded
    and no longer; taken down each column, a tile's windows do not follow the next tile's, so each tile is a request
    of its own and the task holds one tile at a time (with nothing fetched ahead but the next request)."""
    import tifffile

    name = "u16_zstd_pred2"  # 256² tiles, 3 rows x 4 columns of them
    with tifffile.TiffFile(files / f"{name}.tif") as tif:
        page = tif.pages.first
        offsets, counts = list(page.dataoffsets), list(page.databytecounts)
    tile_rows = [[4 * ty + tx for tx in range(3)] for ty in range(2)]
    tops, lefts = [ROW0, ROW0 + 256], [COL0, COL0 + 256, COL0 + 512]
    windows = [((t, t + 256), (c, c + 256)) for t in tops for c in lefts] if across else \
        [((t, t + 256), (c, c + 256)) for c in lefts for t in tops]
    with fault_server(files) as server:
        read = _read(name, f"{server.url}/{name}.tif")
        policy = ReadPolicy(retry=FAST, run_id=f"rows-{across}", io_buffer=1)  # nothing fetched ahead
        with task_reads([[read]], GRID, windows, policy) as session:
            assert session is not None
            for rows, cols in windows:
                out = np.zeros((256, 256), dtype="uint16")
                assert session.read(read, rows, cols, out, None)[0]
                np.testing.assert_array_equal(out, _gdal_window(files / f"{name}.tif", rows, cols, "uint16")[0])
            held = session.holding_peak
        ranges = sorted(tuple(int(v) for v in r[len("bytes="):].split("-"))
                        for _, _, r, _ in server.log if not r.startswith("bytes=0-"))
    collect(f"rows-{across}")
    if across:
        assert ranges == [(offsets[row[0]], offsets[row[-1]] + counts[row[-1]] - 1) for row in tile_rows]
        # a row's tiles go one by one as their windows are done; the next row is fetched ahead as soon as nothing
        # else is in flight, when the first tile of the row before has gone
        first, second = (offsets[row[-1]] + counts[row[-1]] - offsets[row[0]] for row in tile_rows)
        assert held == max(first, first - counts[tile_rows[0][0]] + second)
    else:
        assert ranges == sorted((offsets[n], offsets[n] + counts[n] - 1) for row in tile_rows for n in row)
        assert held == max(counts[n] for row in tile_rows for n in row)


def test_the_buffer_bounds_the_bytes_fetched_ahead(files):
    """With a small buffer the task never has more than about the buffer fetched ahead of its decoder (plus the
    tiles of the window it decodes): the prefetcher's own account, checked after every window."""
    name = "u16_none"  # uncompressed: 256² x 2 bytes = 131 kB a tile
    with fault_server(files) as server:
        read = _read(name, f"{server.url}/{name}.tif")
        policy = ReadPolicy(retry=FAST, run_id="buffer", io_buffer=300_000)
        windows = _windows(128, 128)
        with task_reads([[read]], GRID, windows, policy) as session:
            assert session is not None
            most = 0
            for rows, cols in windows:
                out = np.zeros((rows[1] - rows[0], cols[1] - cols[0]), dtype="uint16")
                session.read(read, rows, cols, out, None)
                most = max(most, session.ahead)
            assert 0 < most <= 300_000 + 4 * 131_072
    collect("buffer")


# ---- reads started ahead of their task ----------------------------------------------------------------------------


def _data_requests(server) -> list[str]:
    """The ranges the server was asked for, headers (``bytes=0-...``) left out."""
    return [r for _, _, r, _ in list(server.log) if r and not r.startswith("bytes=0-")]


def _wait_for(condition, seconds: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_task_takes_over_the_reads_started_ahead_of_it(files):
    """Reads started before the task runs (as the writer starts a queued task's in the one-process layout) are
    in flight or arrived when it starts: the task takes them over and asks for nothing twice (the same requests
    as a task that started them itself), and its values are GDAL's."""
    names = ["u16_zstd_pred2", "i16_lzw"]
    dtypes = [FILES[n][0] for n in names]
    windows = _windows(256, 256)
    with fault_server(files, latency=0.05) as server:
        reads = [_read(n, f"{server.url}/{n}.tif") for n in names]
        policy = ReadPolicy(retry=FAST, run_id="ahead")
        drop = prefetch.ahead([[read] for read in reads], GRID, windows, policy)
        assert drop is not None
        _wait_for(lambda: len(_data_requests(server)) > 0)  # the first window's tiles, before the task runs
        with task_reads([[read] for read in reads], GRID, windows, policy) as session:
            assert session is not None and session.ahead_of_task
            for rows, cols in windows:
                for i, read in enumerate(reads):
                    out = np.zeros((rows[1] - rows[0], cols[1] - cols[0]), dtype=dtypes[i])
                    assert session.read(read, rows, cols, out, None)[0]
                    np.testing.assert_array_equal(out, _gdal_window(files / f"{names[i]}.tif", rows, cols,
                                                                    dtypes[i])[0])
        drop()  # taken over: nothing left to drop
        started_ahead = sorted(_data_requests(server))
        server.reset_counts()
        prefetch.clear_headers()
        _read_all(reads, windows, ReadPolicy(retry=FAST, run_id="itself"), dtypes)
        assert started_ahead == sorted(_data_requests(server))
    io = collect("ahead")["io"]
    assert (io["tasks"], io["tasks_ahead"]) == (1, 1)
    itself = collect("itself")["io"]
    assert (itself["tasks"], itself.get("tasks_ahead", 0)) == (1, 0)


def test_reads_started_ahead_of_a_task_that_never_runs_here_are_dropped(files):
    """The writer drops what a task did not take over (it ran elsewhere, or failed first): the reads are closed,
    and a task starting later after all plans its own."""
    name = "u16_zstd_pred2"
    windows = _windows(256, 256)
    with fault_server(files, latency=0.02) as server:
        read = _read(name, f"{server.url}/{name}.tif")
        policy = ReadPolicy(retry=FAST, run_id="dropped")
        drop = prefetch.ahead([[read]], GRID, windows, policy)
        assert drop is not None
        _wait_for(lambda: len(_data_requests(server)) > 0)
        drop()
        with task_reads([[read]], GRID, windows, policy) as session:
            assert session is not None and not session.ahead_of_task
            out = np.zeros((256, 256), dtype="uint16")
            rows, cols = windows[0]
            assert session.read(read, rows, cols, out, None)[0]
            np.testing.assert_array_equal(out, _gdal_window(files / f"{name}.tif", rows, cols, "uint16")[0])
    collect("dropped")
    assert prefetch.ahead([[read]], GRID, windows, ReadPolicy(io_reader="gdal")) is None


def test_reads_started_ahead_stay_within_the_buffer_until_the_task_starts(files):
    """A queued task's reads fetch within source.io.buffer (the budget counts one buffer per queued task), not its
    whole first window across its files; once the task decodes, it asks for its whole current window."""
    import time

    name = "u16_none"  # uncompressed, its 3 x 4 tiles of 131 kB contiguous: a task's fetches of it are one request
    windows = _windows(256, 256)
    with fault_server(files) as server:
        reads = [_read(name, f"{server.url}/{name}.tif?copy={k}") for k in range(3)]  # three files to the reader
        policy = ReadPolicy(retry=FAST, run_id="queued", io_buffer=1)  # nothing beyond the window's first file
        drop = prefetch.ahead([[read] for read in reads], GRID, windows, policy)
        assert drop is not None
        _wait_for(lambda: len(_data_requests(server)) > 0)
        time.sleep(0.3)  # whatever the queued reads would fetch has been asked for
        assert len(_data_requests(server)) == 1  # the first file's tiles, not the window's in all three files
        with task_reads([[read] for read in reads], GRID, windows, policy) as session:
            assert session is not None and session.ahead_of_task
            # the task started: the rest of its first window is asked for at once, the other two files
            _wait_for(lambda: len(_data_requests(server)) == 3)
            for rows, cols in windows:
                for read in reads:
                    out = np.zeros((rows[1] - rows[0], cols[1] - cols[0]), dtype="uint16")
                    assert session.read(read, rows, cols, out, None)[0]
                    np.testing.assert_array_equal(out, _gdal_window(files / f"{name}.tif", rows, cols,
                                                                    "uint16")[0])
    collect("queued")


def test_reads_are_started_one_task_ahead_per_running_task(files):
    """With no task running, one queued task's reads are started; a later one waits its turn, and when it starts
    first it plans its own reads (it never waits for the queue)."""
    windows = _windows(256, 256)
    with fault_server(files, latency=0.02) as server:
        first, second = (_read(n, f"{server.url}/{n}.tif") for n in ("u16_zstd_pred2", "u8_lzw"))
        policy = ReadPolicy(retry=FAST, run_id="turns")
        drops = [prefetch.ahead([[read]], GRID, windows, policy) for read in (first, second)]
        _wait_for(lambda: any("u16_zstd_pred2" in p for _, p, _, _ in list(server.log)))
        with task_reads([[second]], GRID, windows, policy) as session:
            assert session is not None and not session.ahead_of_task
        with task_reads([[first]], GRID, windows, policy) as session:
            assert session is not None and session.ahead_of_task
        for drop in drops:
            assert drop is not None
            drop()
    io = collect("turns")["io"]
    assert (io["tasks"], io["tasks_ahead"]) == (2, 1)


# ---- faults: as source.retry and on_read_error say ----------------------------------------------------------------


def test_the_longest_waits_name_the_slow_request_and_its_timing(files):
    """A request the server holds for 0.6 s is the longest wait the run keeps: its href and bytes, how long the
    decoder waited, how long the request took once it had a slot, and when it was asked; the values are GDAL's."""
    name = "u16_zstd_pred2"
    windows = _windows(400, 500)
    run_id = "longest-waits"
    with fault_server(files, faults=[Fault("stall", path=f"/{name}.tif", nth={3}, seconds=0.6)]) as server:
        read = _read(name, f"{server.url}/{name}.tif")
        results, _ = _read_all([read], windows, ReadPolicy(retry=FAST, run_id=run_id, io_buffer=1), ["uint16"])
        assert server.count(f"/{name}.tif") >= 3  # the header, then rows of tiles: the third is held
    for rows, cols in windows:
        np.testing.assert_array_equal(results[(0, rows, cols)][0], _gdal_window(files / f"{name}.tif", rows, cols,
                                                                               "uint16")[0])
    io = collect(run_id)["io"]
    waits = io["longest_waits"]
    assert 1 <= len(waits) <= LONGEST_WAITS
    assert [w["seconds"] for w in waits] == sorted((w["seconds"] for w in waits), reverse=True)
    slowest = waits[0]
    assert slowest["href"] == read.href and slowest["bytes"] > 0
    assert 0.45 <= slowest["seconds"] <= slowest["request_seconds"] + slowest["slot_seconds"] + 0.05
    assert slowest["request_seconds"] >= 0.6 and slowest["asked_before"] >= 0
    assert slowest["started_ahead"] is False
    assert all(w["seconds"] < 0.45 for w in waits[1:])
    assert io["wait_seconds"] >= slowest["seconds"]


def test_the_longest_waits_of_several_processes_are_merged():
    """Each worker process keeps its own longest waits; the report keeps the longest of them all, longest first."""
    def part(*seconds):
        return {"io": {"wait_seconds": sum(seconds),
                       "longest_waits": [{"href": f"h{s}", "seconds": s} for s in seconds]}}

    merged = merge_io([part(0.9, 0.5, 0.2), part(1.5, 0.4, 0.3, 0.1, 0.05), {"io": {}}])
    assert [w["seconds"] for w in merged["longest_waits"]] == [1.5, 0.9, 0.5, 0.4, 0.3]
    assert merged["wait_seconds"] == pytest.approx(1.6 + 2.35)


@pytest.mark.parametrize("fault, retried", [
    (Fault("truncate", path="/u16_zstd_pred2.tif", nth={2}), True),
    (Fault("bad_range", path="/u16_zstd_pred2.tif", nth={2}), True),
    # two resets: aiohttp itself retries a GET once when a reused keep-alive connection is reset (not counted as
    # ours), so one or two of ours
    (Fault("reset", path="/u16_zstd_pred2.tif", nth={2, 3}), False),
    (Fault("status", path="/u16_zstd_pred2.tif", nth={2}, status=503), True),
    (Fault("status", path="/u16_zstd_pred2.tif", nth={1}, status=500), True),  # on the header request
    (Fault("stall", path="/u16_zstd_pred2.tif", nth={2}, seconds=3), True),
])
@pytest.mark.parametrize("query", ["", "?signed=1"], ids=["plain", "signed"])
def test_transient_faults_are_retried_and_the_values_are_bit_for_bit(files, fault, retried, query):
    """Plain URLs and URLs with a query string (as signed ones are)."""
    name = "u16_zstd_pred2"
    windows = _windows(400, 500)
    run_id = f"transient-{fault.kind}-{sorted(fault.nth)}-{bool(query)}"  # a run of its own: nothing from another
    with fault_server(files, faults=[fault]) as server:
        read = _read(name, f"{server.url}/{name}.tif{query}")
        results, _ = _read_all([read], windows, ReadPolicy(retry=FAST, run_id=run_id), ["uint16"])
        assert server.statuses()[fault.status if fault.kind == "status" else fault.kind] >= (fault.kind != "stall")
        log = list(server.log)
    for rows, cols in windows:
        np.testing.assert_array_equal(results[(0, rows, cols)][0], _gdal_window(files / f"{name}.tif", rows, cols,
                                                                               "uint16")[0])
    retries = collect(run_id)["retries"]
    if retried:
        assert retries == {read.href: 1}, (retries, log)
    else:
        assert retries in ({}, {read.href: 1}, {read.href: 2}), (retries, log)


@pytest.mark.parametrize("fault, retried", [
    (Fault("truncate", path="/u16_zstd_pred2.tif", nth={2}), True),
    (Fault("status", path="/u16_zstd_pred2.tif", nth={2}, status=503), True),
])
def test_a_row_of_tiles_fetched_once_for_several_windows_is_retried_whole(files, fault, retried):
    """Sub-blocks across each row of them share one request per row of tiles: a transient failure of that request
    is retried once for all of its windows, whose values are GDAL's bit for bit."""
    name = "u16_zstd_pred2"  # 256² tiles
    windows = [((t, t + 256), (c, c + 256)) for t in (ROW0, ROW0 + 256) for c in (COL0, COL0 + 256, COL0 + 512)]
    with fault_server(files, faults=[fault]) as server:
        read = _read(name, f"{server.url}/{name}.tif")
        results, _ = _read_all([read], windows, ReadPolicy(retry=FAST, run_id="row-retry"), ["uint16"])
        ranged = [r for _, _, r, _ in server.log if r and not r.startswith("bytes=0-")]
    assert len(ranged) == 3  # two rows of tiles, one of them twice
    for rows, cols in windows:
        np.testing.assert_array_equal(results[(0, rows, cols)][0], _gdal_window(files / f"{name}.tif", rows, cols,
                                                                               "uint16")[0])
    assert collect("row-retry")["retries"] == {read.href: 1}


def test_a_row_of_tiles_that_cannot_be_read_fails_every_window_that_needs_it(files):
    """A final failure (404) of a request holding the tiles of several windows fails each of those windows with
    the file named, not only the first."""
    name = "u16_zstd_pred2"
    windows = [((ROW0, ROW0 + 256), (c, c + 256)) for c in (COL0, COL0 + 256, COL0 + 512)]
    with fault_server(files, faults=[Fault("status", path=f"/{name}.tif", always=True, status=404,
                                           ranged_only=True)]) as server:
        read = _read(name, f"{server.url}/{name}.tif")
        with task_reads([[read]], GRID, windows, ReadPolicy(retry=FAST, run_id="row-404")) as session:
            assert session is not None
            for rows, cols in windows:
                out = np.zeros((256, 256), dtype="uint16")
                with pytest.raises(ReadFailedError, match="HTTP 404") as caught:
                    session.read(read, rows, cols, out, None)
                assert caught.value.href == read.href and caught.value.status == 404
    collect("row-404")


@pytest.mark.parametrize("fault, message, status, attempts", [
    (Fault("status", path="/u8_lzw.tif", always=True, status=404), "HTTP 404", 404, 1),
    (Fault("status", path="/u8_lzw.tif", always=True, status=403), "HTTP 403", 403, 1),
    (Fault("status", path="/u8_lzw.tif", always=True, status=503), "HTTP 503", 503, 4),
    (Fault("bad_range", path="/u8_lzw.tif", always=True), "wrong Content-Range", None, 4),
    (Fault("truncate", path="/u8_lzw.tif", always=True, ranged_only=True), "truncated", None, 4),
])
@pytest.mark.parametrize("query", ["", "?signed=1"], ids=["plain", "signed"])
def test_failures_name_item_asset_href_and_tries(files, fault, message, status, attempts, query):
    with fault_server(files, faults=[fault]) as server:
        read = _read("u8_lzw", f"{server.url}/u8_lzw.tif{query}")
        with pytest.raises(ReadFailedError, match=message) as caught:
            _read_all([read], _windows(400, 500), ReadPolicy(retry=FAST, run_id="fails"), ["uint8"])
    error = caught.value
    assert "item 'item-u8_lzw' asset 'band'" in str(error) and read.href in str(error)
    assert error.status == status and error.attempts == attempts
    assert (f"gave up after {attempts} tries" in str(error)) == (attempts > 1)
    collect("fails")


def _local_then_remote(sample, tmp_path, output: str, io: str | None = None, **spec):
    """Run the spec on the local files (``out/local.<ext>``), then over HTTP at 20 ms a request
    (``out/remote.<ext>``, with ``source.io: io``) -> the server, stopped, with its counts."""
    from click.testing import CliRunner

    from conftest import spec_text
    from http_faults import http_items
    from rasterflow.cli import cli

    local = tmp_path / "local.yaml"
    local.write_text(spec_text(sample, output=f"out/local.{output}", **spec))
    assert CliRunner().invoke(cli, ["run", str(local)]).exit_code == 0
    with fault_server(sample.directory, latency=0.02) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        text = spec_text(sample, catalog=str(catalog), output=f"out/remote.{output}", **spec)
        remote = tmp_path / "remote.yaml"
        remote.write_text(text if io is None else text.replace("  assets:", f"  io: {io}\n  assets:", 1))
        result = CliRunner().invoke(cli, ["run", str(remote)])
        assert result.exit_code == 0, result.output
    return server


@pytest.mark.slow
def test_a_run_over_http_reports_requests_headers_and_waits_and_equals_the_local_run(sample, tmp_path):
    """A whole run (2 worker processes) over HTTP with latency: bit for bit the local run; the report's reads.io
    counts the requests, the header reads (one per file and worker process at most), the in-flight peak and the
    tasks whose reads the writer started on their worker before sending them."""
    import xarray as xr

    # the fused path: the writer sends each chunk to a worker it picks
    server = _local_then_remote(sample, tmp_path, "zarr", io="{concurrency: 8}", reduce="{method: median}")
    answered = server.count()
    peak = server.in_flight_peak
    expected = xr.open_zarr(tmp_path / "out" / "local.zarr")["ndvi"].values
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "out" / "remote.zarr")["ndvi"].values, expected)
    report = json.loads((tmp_path / "out" / "remote.zarr.report.json").read_text())
    io = report["reads"]["io"]
    files = report["reads"]["files"]
    assert files <= io["header_reads"] <= 2 * files  # once per file and worker process
    # every request the server answered was counted by the workers, but for plan's probes in the client: the first
    # file's header and a timed request, then the first item's file of each of the 3 loaded assets
    assert answered - 5 <= io["requests"] <= answered
    assert 1 <= io["in_flight_peak"] <= 8 and peak <= 2 * 8  # per process: two worker processes
    assert io["bytes"] > 0 and io["wait_seconds"] >= 0
    waits = io["longest_waits"]  # from both worker processes, the longest first: each worker's first chunk waits
    assert 1 <= len(waits) <= 5
    assert [w["seconds"] for w in waits] == sorted((w["seconds"] for w in waits), reverse=True)
    assert all(set(w) == {"href", "bytes", "seconds", "asked_before", "started_ahead", "first_window",
                          "slot_seconds", "request_seconds"} and w["seconds"] <= io["wait_seconds"] for w in waits)
    assert report["reads"]["policy"]["io"]["concurrency"] == 8
    # worker processes: the writer starts a chunk's reads on the worker it sends the chunk to, before sending it
    assert io["tasks"] >= 4 and io["tasks"] // 2 <= io["tasks_ahead"] <= io["tasks"]


@pytest.mark.slow
def test_a_cog_run_on_worker_processes_over_http_starts_each_chunks_reads_on_its_worker(sample, tmp_path):
    """The fused path to COG (a monthly median: one file per month) on 2 worker processes over HTTP: the writer
    sends each chunk's months as one task to a worker it picks, the chunk's reads started there first (the report
    counts them), and every file equals the local run's bit for bit."""
    import rasterio

    _local_then_remote(sample, tmp_path, "tif", reduce="{method: median, period: month}")
    local_files = sorted((tmp_path / "out").glob("local*.tif"))
    assert len(local_files) >= 2  # a file per month
    for path in local_files:
        with rasterio.open(path) as expected, rasterio.open(str(path).replace("local", "remote")) as got:
            np.testing.assert_array_equal(got.read(), expected.read())
    report = json.loads((tmp_path / "out" / "remote.tif.report.json").read_text())
    io = report["reads"]["io"]
    assert io["tasks"] >= 4 and io["tasks"] // 2 <= io["tasks_ahead"] <= io["tasks"]


@pytest.mark.slow
def test_a_time_chunked_run_on_worker_processes_over_http_starts_each_band_tasks_reads_on_its_worker(sample,
                                                                                                  tmp_path):
    """The tree path (a mean with time in chunks of 2 dates) to Zarr on 2 worker processes over HTTP: the writer
    sends each chunk's band tasks to a worker it picks, their reads started there first, and the worker runs them in
    the order they were sent, so every band task but a worker's first finds its reads started (the report counts
    them); the plan says so, and the scheduler of the LocalCluster steals no task away from its reads. Bit for bit
    the local run."""
    import xarray as xr

    server = _local_then_remote(sample, tmp_path, "zarr", reduce="{method: mean}", chunks="{time: 2, y: 96, x: 96}")
    expected = xr.open_zarr(tmp_path / "out" / "local.zarr")["ndvi"].values
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "out" / "remote.zarr")["ndvi"].values, expected)
    report = json.loads((tmp_path / "out" / "remote.zarr.report.json").read_text())
    io = report["reads"]["io"]
    height, width = report["grid"]["shape"]
    chunks, time_chunks = -(-height // 96) * -(-width // 96), -(-len(report["item_ids"]) // 2)
    assert io["tasks"] == chunks * time_chunks  # each band task read once: none was stolen and read again
    assert io["tasks"] - 2 <= io["tasks_ahead"] <= io["tasks"]  # all but each worker's first
    assert server.count() - 5 <= io["requests"]
    assert report["cluster"]["work_stealing"] is False
    local = json.loads((tmp_path / "out" / "local.zarr.report.json").read_text())
    assert local["cluster"]["work_stealing"] is True  # local files: nothing is placed


@pytest.mark.slow
def test_a_series_on_worker_processes_over_http_starts_each_time_blocks_reads_on_its_worker(sample, tmp_path):
    """The series path (no reduction; time in chunks of 2 dates) to Zarr on 2 worker processes over HTTP: each time
    block of a chunk (its band task and writes) is a unit of its own, sent to a worker the writer picks with its
    reads started there first, so every band task but a worker's first finds its reads started; the scheduler steals
    none of them away. Bit for bit the local run."""
    import xarray as xr

    server = _local_then_remote(sample, tmp_path, "zarr", chunks="{time: 2, y: 96, x: 96}")
    expected = xr.open_zarr(tmp_path / "out" / "local.zarr")["ndvi"].values
    assert expected.ndim == 3 and expected.shape[0] == len(json.loads(
        (tmp_path / "out" / "local.zarr.report.json").read_text())["item_ids"])  # the series itself
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "out" / "remote.zarr")["ndvi"].values, expected)
    report = json.loads((tmp_path / "out" / "remote.zarr.report.json").read_text())
    io = report["reads"]["io"]
    height, width = report["grid"]["shape"]
    chunks, time_chunks = -(-height // 96) * -(-width // 96), -(-expected.shape[0] // 2)
    assert io["tasks"] == chunks * time_chunks  # each band task read once: none was stolen and read again
    assert io["tasks"] - 2 <= io["tasks_ahead"] <= io["tasks"]  # all but each worker's first
    assert server.count() - 5 <= io["requests"]
    assert report["cluster"]["work_stealing"] is False


@pytest.mark.slow
def test_a_time_chunked_cog_on_worker_processes_over_http_starts_each_band_tasks_reads_on_its_worker(sample,
                                                                                                    tmp_path):
    """The tree path (a mean, time in chunks of 2 dates) to COG on 2 worker processes over HTTP: as for Zarr, each
    chunk's tasks go to the worker that started its band tasks' reads; the file equals the local run's bit for
    bit."""
    import rasterio

    _local_then_remote(sample, tmp_path, "tif", reduce="{method: mean}", chunks="{time: 2, y: 96, x: 96}")
    with rasterio.open(tmp_path / "out" / "local.tif") as expected, \
            rasterio.open(tmp_path / "out" / "remote.tif") as got:
        np.testing.assert_array_equal(got.read(), expected.read())
    report = json.loads((tmp_path / "out" / "remote.tif.report.json").read_text())
    io = report["reads"]["io"]
    assert io["tasks"] >= 8 and io["tasks"] - 2 <= io["tasks_ahead"] <= io["tasks"]
    assert report["cluster"]["work_stealing"] is False


@pytest.mark.slow
def test_a_time_chunked_chunk_of_more_blocks_than_the_cap_still_goes_one_per_worker_with_its_reads_started(
        sample, tmp_path):
    """Two bands per month (3 months: 6 blocks a chunk; 2 workers x 6 > the writer's 8 blocks in flight): the writer
    still keeps a chunk per worker thread in flight (not one chunk at a time), each sent to its worker with its
    reads started there first; the LocalCluster steals no work; bit for bit the local run."""
    import xarray as xr

    bands = 'ndvi: "(nir - red) / (nir + red)"\nndwi: "(green - nir) / (green + nir)"'
    _local_then_remote(sample, tmp_path, "zarr", reduce="{method: mean, period: month}", bands=bands,
                       chunks="{time: 2, y: 96, x: 96}")
    for name in ("ndvi", "ndwi"):
        expected = xr.open_zarr(tmp_path / "out" / "local.zarr")[name].values
        assert expected.shape[0] == 3  # months
        np.testing.assert_array_equal(xr.open_zarr(tmp_path / "out" / "remote.zarr")[name].values, expected)
    report = json.loads((tmp_path / "out" / "remote.zarr.report.json").read_text())
    io = report["reads"]["io"]
    assert io["tasks"] >= 8 and io["tasks"] // 2 <= io["tasks_ahead"] <= io["tasks"]
    assert report["cluster"]["work_stealing"] is False


@pytest.mark.slow
def test_a_cog_chunk_with_more_entries_than_a_batch_keeps_a_task_per_entry(sample, tmp_path):
    """Monthly quantiles (3 months x 3 quantiles: 9 entries a chunk, over the 4 blocks a batch takes on 2 threads)
    to COG on worker processes over HTTP: the chunk is not made one task (its entries would all come back to the
    writer at once), so no chunk is placed and its tasks start their own reads; the files equal the local run's."""
    import rasterio

    _local_then_remote(sample, tmp_path, "tif", reduce="{method: quantile, q: [0.1, 0.5, 0.9], period: month}")
    local_files = sorted((tmp_path / "out").glob("local*.tif"))
    assert len(local_files) >= 6
    for path in local_files:
        with rasterio.open(path) as expected, rasterio.open(str(path).replace("local", "remote")) as got:
            np.testing.assert_array_equal(got.read(), expected.read())
    io = json.loads((tmp_path / "out" / "remote.tif.report.json").read_text())["reads"]["io"]
    assert io["tasks"] >= 4 and io.get("tasks_ahead", 0) == 0


def test_a_one_process_run_over_http_starts_queued_tasks_reads_ahead_and_equals_the_local_run(sample, tmp_path):
    """The one-process layout: the writer starts each queued chunk's reads before a thread runs it; the run's
    values are the local run's, and the report counts the tasks that found their reads started."""
    import xarray as xr

    _local_then_remote(sample, tmp_path, "zarr", cluster="{n_workers: 1, threads_per_worker: 2, processes: false}")
    expected = xr.open_zarr(tmp_path / "out" / "local.zarr")["ndvi"].values
    np.testing.assert_array_equal(xr.open_zarr(tmp_path / "out" / "remote.zarr")["ndvi"].values, expected)
    reads = json.loads((tmp_path / "out" / "remote.zarr.report.json").read_text())["reads"]
    io = reads["io"]
    assert io["tasks"] >= 4
    assert io["tasks"] // 2 <= io["tasks_ahead"] <= io["tasks"]  # all but the first few
    assert reads["policy"]["io"]["buffer"] == 16 * 1024 * 1024  # buffer: auto at a ~20 ms round trip


def test_plan_takes_the_compressed_bytes_per_pixel_of_every_loaded_asset(sample, tmp_path):
    """``plan``'s remote bytes and the budget's held tiles multiply by the compressed bytes per pixel of the first
    item's file of every asset the job loads (a mask band of few classes compresses far better than reflectances),
    not of the first asset's alone: the value equals the files' own tile bytes over their pixels (tifffile)."""
    import tifffile

    from conftest import spec_text
    from http_faults import http_items
    from rasterflow.commands import plan_with_items, resolve_layout, search
    from rasterflow.spec import load_spec

    def packed(paths: list[Path]) -> float:
        nbytes = pixels = 0
        for path in paths:
            with tifffile.TiffFile(path) as tif:
                page = tif.pages[0]
                nbytes += sum(int(n) for n in page.databytecounts)
                pixels += page.imagelength * page.imagewidth
        return nbytes / pixels

    first = json.loads(Path(sample.items_json).read_text())["features"][0]["assets"]
    loaded_assets = [Path(first[key]["href"]) for key in ("red", "nir", "scl")]  # green is not used by the job
    assert packed(loaded_assets[-1:]) < 0.8 * packed(loaded_assets[:1])  # the classes compress better
    with fault_server(sample.directory) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        spec = tmp_path / "bpp.yaml"
        spec.write_text(spec_text(sample, catalog=str(catalog), output="out/bpp.zarr"))
        loaded = load_spec(spec)
        plan = plan_with_items(loaded, search(loaded), resolve_layout(loaded.spec))
    assert plan.report.inputs.remote_fetch
    assert plan.report.inputs.source_bytes_per_pixel == pytest.approx(packed(loaded_assets), rel=1e-9)


@pytest.mark.slow
def test_the_budget_bounds_the_compressed_bytes_a_task_holds(sample, tmp_path):
    """The budget's remote-read term per task (source.io.buffer + the tiles later sub-blocks share) against the
    most compressed bytes a real task held, measured by the reader: never more, and the buffer really used."""
    from click.testing import CliRunner

    from conftest import spec_text
    from http_faults import http_items
    from rasterflow import budget
    from rasterflow.cli import cli
    from rasterflow.commands import plan_with_items, resolve_layout, search
    from rasterflow.spec import load_spec

    with fault_server(sample.directory, latency=0.01) as server:
        catalog = http_items(sample, server.url, tmp_path / "items.json")
        spec = tmp_path / "held.yaml"
        spec.write_text(spec_text(sample, catalog=str(catalog), output="out/held.zarr",
                                  chunks="{time: -1, y: -1, x: -1}",
                                  cluster="{n_workers: 1, threads_per_worker: 1, processes: false}")
                        .replace("  assets:", "  io: {buffer: 1MB}\n  assets:", 1))
        loaded = load_spec(spec)
        plan = plan_with_items(loaded, search(loaded), resolve_layout(loaded.spec))
        assert plan.report.inputs.remote_fetch
        predicted = budget.remote_io_bytes(plan.shape, plan.report.inputs)
        result = CliRunner().invoke(cli, ["run", str(spec)])
        assert result.exit_code == 0, result.output
    io = json.loads((tmp_path / "out" / "held.zarr.report.json").read_text())["reads"]["io"]
    measured = io["held_peak"]
    assert 0.5 * predicted <= measured <= predicted, (measured, predicted)


def test_the_bad_range_fault_is_wrong_for_a_range_that_ends_the_file_too(files):
    """The fault server's ``bad_range`` shifts every range, the file's last bytes included (a range that ends the
    file is sent one byte early): whichever request it hits is one the reader must refuse and retry."""
    import urllib.request

    size = (files / "u8_lzw.tif").stat().st_size
    with fault_server(files, faults=[Fault("bad_range", path="/u8_lzw.tif", always=True)]) as server:
        for first, last in ((0, 99), (size - 100, size - 1)):
            asked = urllib.request.Request(f"{server.url}/u8_lzw.tif", headers={"Range": f"bytes={first}-{last}"})
            with urllib.request.urlopen(asked) as answer:
                got = answer.headers["Content-Range"]
            assert got != f"bytes {first}-{last}/{size}" and got.endswith(f"/{size}")
