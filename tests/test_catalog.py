"""rasterflow.catalog: local item files filtered in-process, and the same searches against real STAC APIs.

Expected results are computed here with plain Python over the generated item dicts, independently of the code
under test. The server tests start ``rustac serve`` and stac-fastapi-pgstac once per module
(see tests/stac_servers.py; install the tools with .ci/install-stac-server.sh).
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone

import pytest

from rasterflow.catalog import (
    QUERY_OPS,
    StacQuery,
    match_query,
    query_to_cql2,
    resolve_datetime,
    search_items,
)
from rasterflow.errors import CatalogError, NoItemsFoundError

from data_stac import make_items, write_stac_files
from stac_servers import free_port, pgstac_server, rustac_server, skip_or_fail

ITEMS = make_items()
BY_ID = {i["id"]: i for i in ITEMS}


# ------------------------------------------------------------------------------------------------- helpers


def ordered(items) -> list[str]:
    """Ids in the documented result order: ascending (datetime, id). All test datetimes share one format."""
    return [i["id"] for i in sorted(items, key=lambda i: (i["properties"]["datetime"], i["id"]))]


def ids(items) -> list[str]:
    return [i["id"] for i in items]


def overlaps(item_bbox, q) -> bool:
    w, s, e, n = item_bbox
    return w <= q[2] and q[0] <= e and s <= q[3] and q[1] <= n


def newest(items, n) -> list[str]:
    """The n most recent by (datetime desc, id desc), returned ascending."""
    desc = sorted(items, key=lambda i: (i["properties"]["datetime"], i["id"]), reverse=True)
    return ordered(desc[:n])


@pytest.fixture(scope="module")
def stac_files(tmp_path_factory):
    return write_stac_files(tmp_path_factory.mktemp("stac"))


@pytest.fixture(scope="module", params=["json", "ndjson", "parquet"])
def local_catalog(request, stac_files) -> str:
    return str(getattr(stac_files, request.param))


@pytest.fixture(scope="module")
def rustac_url(stac_files):
    with rustac_server(stac_files.collections, stac_files.ndjson) as url:
        yield url


@pytest.fixture(scope="module")
def pgstac_url(stac_files):
    with pgstac_server(stac_files.collections, stac_files.ndjson) as url:
        yield url


@pytest.fixture
def search_requests(monkeypatch):
    """Records the parameters (POST bodies) of the requests pystac-client sends to /search."""
    from pystac_client.stac_api_io import StacApiIO

    calls: list[dict] = []
    original = StacApiIO.request

    def counting(self, href, *args, **kwargs):
        if str(href).rstrip("/").endswith("/search"):
            calls.append(dict(kwargs.get("parameters") or {}))
        return original(self, href, *args, **kwargs)

    monkeypatch.setattr(StacApiIO, "request", counting)
    return calls


# ------------------------------------------------------------------------------------------------- local files


def test_module_import_is_light():
    code = (
        "import sys, rasterflow.catalog; "
        "heavy = [m for m in ('pystac_client', 'pystac', 'rustac', 'cql2', 'requests', 'dask') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_all_items_in_order(local_catalog):
    got = search_items(StacQuery(local_catalog))
    assert ids(got) == ordered(ITEMS)
    assert len(got) == 12


def test_three_formats_give_the_same_ids(stac_files):
    q = dict(
        collections=("test-s2", "test-ls"),
        bbox=(12.9, 52.0, 14.5, 53.0),
        datetime="2024-02-01/2024-09-05",
        query={"eo:cloud_cover": {"lte": 70}},
        filter="platform <> 'sentinel-2c'",
    )
    results = {p.suffix: ids(search_items(StacQuery(str(p), **q))) for p in (stac_files.json, stac_files.ndjson,
                                                                           stac_files.parquet)}
    expected = ordered(
        i for i in ITEMS
        if overlaps(i["bbox"], q["bbox"])
        and "2024-02-01" <= i["properties"]["datetime"][:10] <= "2024-09-05"
        and i["properties"]["eo:cloud_cover"] <= 70
        and i["properties"]["platform"] != "sentinel-2c"
    )
    assert expected == ["ls-a", "s2-b", "s2-d", "ls-b", "s2-e"]
    assert results == {".json": expected, ".ndjson": expected, ".parquet": expected}


@pytest.mark.parametrize("collections", [("test-s2",), ("test-ls",), ("test-ls", "test-s2")])
def test_collections(local_catalog, collections):
    got = search_items(StacQuery(local_catalog, collections=collections))
    assert ids(got) == ordered(i for i in ITEMS if i["collection"] in collections)


@pytest.mark.parametrize(
    "bbox",
    [
        (13.0, 52.3, 13.8, 52.7),   # Berlin
        (2.3, 48.8, 2.4, 48.9),     # Paris: s2-c and ls-c
        (13.5, 52.6, 13.6, 52.7),   # touches edges of several items
        (-74.0, 40.6, -73.9, 40.7),  # New York
    ],
)
def test_bbox(local_catalog, bbox):
    got = search_items(StacQuery(local_catalog, bbox=bbox))
    assert ids(got) == ordered(i for i in ITEMS if overlaps(i["bbox"], bbox))


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


MAX = datetime.max.replace(tzinfo=timezone.utc)
MIN = datetime.min.replace(tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("interval", "lo", "hi"),
    [
        ("2024-06-01/2024-08-31", utc("2024-06-01T00:00:00Z"), utc("2024-08-31T23:59:59.999999Z")),
        ("2024-07-01T10:00:00Z/..", utc("2024-07-01T10:00:00Z"), MAX),
        ("../2024-02-14", MIN, utc("2024-02-14T23:59:59.999999Z")),
        ("/2024-02-14T15:30:00Z", MIN, utc("2024-02-14T15:30:00Z")),
        ("2024-07", utc("2024-07-01T00:00:00Z"), utc("2024-07-31T23:59:59.999999Z")),
        ("2024-07-01T10:00:00Z", utc("2024-07-01T10:00:00Z"), utc("2024-07-01T10:00:00Z")),
        ("2024-07-01T12:00:00+02:00", utc("2024-07-01T10:00:00Z"), utc("2024-07-01T10:00:00Z")),
    ],
)
def test_datetime(local_catalog, interval, lo, hi):
    got = search_items(StacQuery(local_catalog, datetime=interval))
    expected = ordered(i for i in ITEMS if lo <= utc(i["properties"]["datetime"]) <= hi)
    assert expected
    assert ids(got) == expected


QUERY_CASES = [
    ({"eo:cloud_cover": {"lt": 40}}, lambda p: p["eo:cloud_cover"] < 40),
    ({"eo:cloud_cover": {"lte": 40}}, lambda p: p["eo:cloud_cover"] <= 40),
    ({"eo:cloud_cover": {"gt": 40, "lte": 70}}, lambda p: 40 < p["eo:cloud_cover"] <= 70),
    ({"eo:cloud_cover": {"gte": 55.5}}, lambda p: p["eo:cloud_cover"] >= 55.5),
    ({"platform": {"eq": "landsat-9"}}, lambda p: p["platform"] == "landsat-9"),
    ({"platform": {"neq": "landsat-9"}}, lambda p: p["platform"] != "landsat-9"),
    ({"platform": {"startsWith": "sentinel"}}, lambda p: p["platform"].startswith("sentinel")),
    ({"platform": {"endsWith": "2b"}}, lambda p: p["platform"].endswith("2b")),
    ({"platform": {"contains": "tinel-2"}}, lambda p: "tinel-2" in p["platform"]),
    ({"platform": {"in": ["landsat-8", "sentinel-2c"]}}, lambda p: p["platform"] in ("landsat-8", "sentinel-2c")),
    (
        {"platform": {"startsWith": "sentinel"}, "eo:cloud_cover": {"lt": 30}},
        lambda p: p["platform"].startswith("sentinel") and p["eo:cloud_cover"] < 30,
    ),
]


@pytest.mark.parametrize(("query", "pred"), QUERY_CASES, ids=[json.dumps(c[0]) for c in QUERY_CASES])
def test_query(local_catalog, query, pred):
    got = search_items(StacQuery(local_catalog, query=query))
    expected = ordered(i for i in ITEMS if pred(i["properties"]))
    assert expected
    assert ids(got) == expected


def test_query_covers_every_operator():
    used = {op for q, _ in QUERY_CASES for ops in q.values() for op in ops}
    assert used == set(QUERY_OPS)


@pytest.mark.parametrize(("query", "pred"), QUERY_CASES, ids=[json.dumps(c[0]) for c in QUERY_CASES])
def test_query_to_cql2_agrees_with_query(query, pred):
    import cql2

    expr = cql2.Expr(query_to_cql2(query))
    for item in ITEMS:
        assert match_query(item, query) is pred(item["properties"]) is expr.matches(item), item["id"]


def test_query_missing_property_never_matches():
    assert not match_query(BY_ID["s2-a"], {"view:sun_elevation": {"neq": 3}})
    assert not match_query(BY_ID["s2-a"], {"eo:cloud_cover": {"eq": "5"}})  # type mismatch


FILTER_CASES = [
    ("eo:cloud_cover < 40 AND platform = 'sentinel-2a'",
     lambda i: i["properties"]["eo:cloud_cover"] < 40 and i["properties"]["platform"] == "sentinel-2a"),
    ({"op": "or", "args": [
        {"op": ">=", "args": [{"property": "eo:cloud_cover"}, 70]},
        {"op": "=", "args": [{"property": "collection"}, "test-ls"]},
    ]}, lambda i: i["properties"]["eo:cloud_cover"] >= 70 or i["collection"] == "test-ls"),
    ("platform LIKE 'landsat%' AND eo:cloud_cover BETWEEN 10 AND 40",
     lambda i: i["properties"]["platform"].startswith("landsat") and 10 <= i["properties"]["eo:cloud_cover"] <= 40),
    ("platform IN ('sentinel-2b', 'landsat-9')", lambda i: i["properties"]["platform"] in ("sentinel-2b", "landsat-9")),
    ("datetime >= TIMESTAMP('2024-07-01T10:00:00Z')", lambda i: i["properties"]["datetime"] >= "2024-07-01T10:00:00Z"),
]


@pytest.mark.parametrize(("flt", "pred"), FILTER_CASES, ids=["text-and", "json-or", "text-like-between", "text-in",
                                                              "text-timestamp"])
def test_filter(local_catalog, flt, pred):
    got = search_items(StacQuery(local_catalog, filter=flt))
    expected = ordered(i for i in ITEMS if pred(i))
    assert expected
    assert ids(got) == expected


def test_filter_on_a_missing_property_matches_nothing(stac_files):
    with pytest.raises(NoItemsFoundError, match="view:off_nadir"):
        search_items(StacQuery(str(stac_files.ndjson), filter="view:off_nadir < 5"))


@pytest.mark.parametrize("n", [1, 5, 6, 12, 50])
def test_max_items_keeps_the_most_recent(local_catalog, n):
    got = search_items(StacQuery(local_catalog, max_items=n))
    assert ids(got) == newest(ITEMS, n)
    if n == 5:  # s2-e and s2-f share a datetime: the tie goes to the larger id, as in pgstac
        assert "s2-f" in ids(got) and "s2-e" not in ids(got)


def test_max_items_after_filtering(local_catalog):
    got = search_items(StacQuery(local_catalog, collections=("test-s2",), query={"eo:cloud_cover": {"lt": 50}},
                                 max_items=3))
    assert ids(got) == newest([i for i in ITEMS if i["collection"] == "test-s2"
                               and i["properties"]["eo:cloud_cover"] < 50], 3)


NOW = datetime(2024, 9, 15, 12, 0, tzinfo=timezone.utc)


def test_resolve_datetime():
    assert resolve_datetime("P30D", NOW) == "2024-08-16T12:00:00Z/2024-09-15T12:00:00Z"
    assert resolve_datetime("PT12H", NOW) == "2024-09-15T00:00:00Z/2024-09-15T12:00:00Z"
    assert resolve_datetime("P1Y", NOW) == "2023-09-15T12:00:00Z/2024-09-15T12:00:00Z"
    assert resolve_datetime("P1Y", datetime(2024, 2, 29)) == "2023-02-28T00:00:00Z/2024-02-29T00:00:00Z"
    assert resolve_datetime("P2W", NOW) == "2024-09-01T12:00:00Z/2024-09-15T12:00:00Z"
    assert resolve_datetime(" 2024-06-01/2024-08-31 ", NOW) == "2024-06-01/2024-08-31"
    assert resolve_datetime(None) is None and resolve_datetime("") is None
    start, end = resolve_datetime("P1D").split("/")  # default now: the current time
    assert abs(datetime.fromisoformat(end.replace("Z", "+00:00")) - datetime.now(timezone.utc)).total_seconds() < 60


def test_relative_datetime_with_injected_now(local_catalog):
    got = search_items(StacQuery(local_catalog, datetime="P30D"), now=NOW)
    expected = ordered(i for i in ITEMS if "2024-08-16T12:00:00Z" <= i["properties"]["datetime"] <= "2024-09-15T12")
    assert ids(got) == expected == ["s2-g", "ls-d", "s2-h"]
    got = search_items(StacQuery(local_catalog, datetime="P1Y"), now=datetime(2024, 6, 30, 16, tzinfo=timezone.utc))
    assert ids(got) == ordered(i for i in ITEMS if i["properties"]["datetime"] <= "2024-06-30T16")


def test_proj_epsg_restored(local_catalog):
    got = search_items(StacQuery(local_catalog))
    for item in got:
        epsg = item["properties"]["proj:epsg"]
        assert isinstance(epsg, int)
        if "proj:code" in item["properties"]:
            assert item["properties"]["proj:code"] == f"EPSG:{epsg}"
        for asset in item["assets"].values():
            assert asset["proj:epsg"] == epsg
    assert {i["id"] for i in got if "proj:code" in i["properties"]}  # some items only carried proj:code


def test_edge_cases_start_end_datetime_and_antimeridian(tmp_path):
    base = make_items()[0]
    ranged = json.loads(json.dumps(base))
    ranged["id"] = "ranged"
    ranged["properties"].update(datetime=None, start_datetime="2024-03-01T00:00:00Z",
                                end_datetime="2024-03-31T23:59:59Z")
    fiji = json.loads(json.dumps(base))
    fiji["id"] = "fiji"
    fiji["bbox"] = [177.0, -19.0, 179.5, -16.0]
    fiji["geometry"] = {"type": "Point", "coordinates": [178.0, -17.5]}
    path = tmp_path / "edge.ndjson"
    path.write_text("\n".join(json.dumps(i) for i in (base, ranged, fiji)) + "\n")
    assert ids(search_items(StacQuery(str(path), datetime="2024-03-15/2024-04-30"))) == ["ranged"]
    assert ids(search_items(StacQuery(str(path), datetime="2024-01-01/2024-03-01"))) == ["fiji", "s2-a", "ranged"]
    assert ids(search_items(StacQuery(str(path), bbox=(175.0, -20.0, -175.0, -10.0)))) == ["fiji"]  # crosses 180°


# ------------------------------------------------------------------------------------------------- errors


def test_zero_matches_say_what_to_widen(local_catalog):
    q = StacQuery(local_catalog, collections=("test-s2",), bbox=(100.0, 10.0, 101.0, 11.0),
                  datetime="2024-06-01/2024-06-30", query={"eo:cloud_cover": {"lt": 1}}, filter="platform = 'x'")
    with pytest.raises(NoItemsFoundError) as exc:
        search_items(q)
    msg = str(exc.value)
    for text in ("matched no items", "test-s2", "[100.0, 10.0, 101.0, 11.0]",
                 "2024-06-01T00:00:00Z/2024-06-30T23:59:59.999999Z", '"eo:cloud_cover"', "platform = 'x'",
                 "enlarge bbox", "widen datetime", "relax query", "relax filter", "check the collection ids",
                 "the file holds 12 items in collections test-ls, test-s2"):
        assert text in msg, text
    assert isinstance(exc.value, CatalogError)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.ndjson"
    with pytest.raises(CatalogError, match="not found") as exc:
        search_items(StacQuery(str(path)))
    assert str(path) in str(exc.value)


def test_unsupported_extension(tmp_path):
    path = tmp_path / "items.csv"
    path.write_text("id\n")
    with pytest.raises(CatalogError) as exc:
        search_items(StacQuery(str(path)))
    for ext in (".json", ".ndjson", ".parquet", str(path)):
        assert ext in str(exc.value)


def test_invalid_json_names_the_line(tmp_path):
    lines = [json.dumps(i) for i in make_items()[:3]]
    lines[2] = lines[2][:40]
    nd = tmp_path / "bad.ndjson"
    nd.write_text("\n".join(lines) + "\n")
    with pytest.raises(CatalogError, match=rf"{nd}:3:\d+: invalid JSON"):
        search_items(StacQuery(str(nd)))
    js = tmp_path / "bad.json"
    js.write_text('{\n  "type": "FeatureCollection",\n  "features": [\n    {"id": }\n  ]\n}\n')
    with pytest.raises(CatalogError, match=rf"{js}:4:\d+: invalid JSON"):
        search_items(StacQuery(str(js)))


def test_json_forms_and_non_items(tmp_path):
    items = make_items()
    as_list = tmp_path / "list.json"
    as_list.write_text(json.dumps(items))
    assert ids(search_items(StacQuery(str(as_list)))) == ordered(items)
    coll = tmp_path / "collection.json"
    coll.write_text(json.dumps({"type": "Collection", "id": "c"}))
    with pytest.raises(CatalogError, match="is a STAC Collection, not a file of items"):
        search_items(StacQuery(str(coll)))


def test_bad_query_filter_datetime(stac_files):
    path = str(stac_files.ndjson)
    with pytest.raises(CatalogError, match="unknown operator 'like'.*startsWith"):
        search_items(StacQuery(path, query={"platform": {"like": "s%"}}))
    with pytest.raises(CatalogError, match="invalid cql2-text"):
        search_items(StacQuery(path, filter="eo:cloud_cover <<< 3"))
    with pytest.raises(CatalogError, match="invalid datetime 'last summer'"):
        search_items(StacQuery(path, datetime="last summer"))
    with pytest.raises(CatalogError, match="start is after the end"):
        search_items(StacQuery(path, datetime="2024-09-01/2024-01-01"))
    with pytest.raises(CatalogError, match="max_items"):
        StacQuery(path, max_items=0)
    with pytest.raises(CatalogError, match="bbox"):
        StacQuery(path, bbox=(0, 10, 1, 5))


def test_unreachable_api():
    url = f"http://127.0.0.1:{free_port()}/stac"
    with pytest.raises(CatalogError) as exc:
        search_items(StacQuery(url, collections=("x",)))
    msg = str(exc.value)
    assert url in msg and "refused" in msg.lower()
    assert "Traceback" not in msg and "HTTPConnectionPool" not in msg


def test_skip_or_fail_fails_on_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="install-stac-server.sh"):
        skip_or_fail("tool x missing")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="install-stac-server.sh"):
        skip_or_fail("tool x missing")


# ------------------------------------------------------------------------------------------------- rustac serve

SERVER_CASES = {
    "all": {},
    "collections": dict(collections=("test-ls",)),
    "bbox": dict(bbox=(13.0, 52.3, 13.8, 52.7)),
    "datetime": dict(datetime="2024-06-01/2024-08-31"),
    "combined": dict(collections=("test-s2", "test-ls"), bbox=(12.9, 52.0, 14.5, 53.0),
                     datetime="2024-02-01/2024-09-05"),
    "max_items": dict(max_items=5),
    "max_items_filtered": dict(collections=("test-s2",), bbox=(12.9, 52.0, 14.5, 53.0), max_items=3),
}


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("case", list(SERVER_CASES))
def test_rustac_serve_matches_local(rustac_url, stac_files, search_requests, case):
    kwargs = SERVER_CASES[case]
    local = search_items(StacQuery(str(stac_files.parquet), **kwargs))
    remote = search_items(StacQuery(rustac_url, **kwargs), page_size=2)
    assert ids(remote) == ids(local)
    for item in remote:
        assert isinstance(item["properties"]["proj:epsg"], int)
    if case == "all":
        assert len(search_requests) >= 6  # 12 items, 2 per page: paging really happened


@pytest.mark.server
@pytest.mark.slow
def test_rustac_serve_pages(rustac_url, stac_files, search_requests):
    q = StacQuery(rustac_url, collections=("test-s2",), bbox=(12.0, 51.0, 14.5, 53.0), datetime="2024-01-01/2024-08-31")
    got = search_items(q, page_size=2)
    expected = search_items(StacQuery(str(stac_files.ndjson), collections=q.collections, bbox=q.bbox,
                                      datetime=q.datetime))
    assert ids(got) == ids(expected) == ["s2-a", "s2-b", "s2-d", "s2-e", "s2-f", "s2-g"]
    assert len(search_requests) >= 3


@pytest.mark.server
@pytest.mark.slow
def test_rustac_serve_refuses_query_and_filter(rustac_url):
    # rustac's memory backend would ignore them silently (POST returns nothing): refuse instead
    with pytest.raises(CatalogError, match="neither the query nor the filter extension"):
        search_items(StacQuery(rustac_url, query={"eo:cloud_cover": {"lt": 40}}))
    with pytest.raises(CatalogError, match="does not support the filter extension"):
        search_items(StacQuery(rustac_url, filter="eo:cloud_cover < 40"))


@pytest.mark.server
@pytest.mark.slow
def test_rustac_serve_no_items(rustac_url):
    with pytest.raises(NoItemsFoundError, match="matched no items") as exc:
        search_items(StacQuery(rustac_url, collections=("test-s2",), bbox=(100.0, 0.0, 101.0, 1.0)))
    assert rustac_url in str(exc.value)


# ------------------------------------------------------------------------------------------------- pgstac

PGSTAC_CASES = {
    **SERVER_CASES,
    "query-native": dict(query={"eo:cloud_cover": {"lt": 40}, "platform": {"neq": "landsat-8"}}),
    "query-extended-ops": dict(query={"platform": {"startsWith": "sentinel", "in": ["sentinel-2a", "sentinel-2c"]}}),
    "filter-text": dict(filter="eo:cloud_cover < 40 AND platform = 'sentinel-2a'"),
    "filter-json": dict(filter=FILTER_CASES[1][0]),
    "filter-like-between": dict(filter=FILTER_CASES[2][0]),
    "query-and-filter": dict(collections=("test-s2",), query={"eo:cloud_cover": {"gte": 5}},
                             filter="platform LIKE '%2b'", datetime="2024-03-01/.."),
    "query-filter-max-items": dict(query={"eo:cloud_cover": {"lt": 60}}, filter="collection = 'test-s2'",
                                   max_items=4),
}


@pytest.mark.server
@pytest.mark.slow
@pytest.mark.parametrize("case", list(PGSTAC_CASES))
def test_pgstac_matches_local(pgstac_url, stac_files, search_requests, case):
    kwargs = PGSTAC_CASES[case]
    local = search_items(StacQuery(str(stac_files.ndjson), **kwargs))
    remote = search_items(StacQuery(pgstac_url, **kwargs), page_size=3)
    assert ids(remote) == ids(local)
    for item in remote:
        epsg = item["properties"]["proj:epsg"]
        assert all(a["proj:epsg"] == epsg for a in item["assets"].values())
    # what was sent: basic query ops natively; extended ops, or query with filter, as CQL2; text filters as JSON
    first = search_requests[0]
    if case == "query-native":
        assert first["query"] == kwargs["query"] and "filter" not in first
    if case in ("query-extended-ops", "query-and-filter", "query-filter-max-items"):
        assert "query" not in first and isinstance(first["filter"], dict)
    if "filter" in kwargs:
        assert isinstance(first["filter"], dict) and first["filter-lang"] == "cql2-json"
    if "max_items" in kwargs:  # pgstac declares sort: ask for the newest first and stop after max_items
        assert first["sortby"][0] == {"field": "properties.datetime", "direction": "desc"}
        assert len(search_requests) <= -(-kwargs["max_items"] // 3)  # stopped after max_items
    else:
        assert "sortby" not in first
        assert len(search_requests) >= -(-len(local) // 3)  # every page of 3 was fetched


@pytest.mark.server
@pytest.mark.slow
def test_pgstac_relative_datetime(pgstac_url, stac_files):
    q = dict(datetime="P30D", collections=("test-s2", "test-ls"))
    assert ids(search_items(StacQuery(pgstac_url, **q), now=NOW)) == ["s2-g", "ls-d", "s2-h"]
    assert ids(search_items(StacQuery(str(stac_files.json), **q), now=NOW)) == ["s2-g", "ls-d", "s2-h"]


@pytest.mark.server
@pytest.mark.slow
def test_pgstac_errors(pgstac_url):
    with pytest.raises(NoItemsFoundError, match="relax filter"):
        search_items(StacQuery(pgstac_url, filter="eo:cloud_cover < 0"))
    with pytest.raises(CatalogError, match=r"the search at http://127\.0\.0\.1:\d+/ failed: HTTP 5\d\d"):
        # cql2 accepts an unknown function-like op; pgstac answers HTTP 500
        search_items(StacQuery(pgstac_url, filter={"op": "no-such-op", "args": [{"property": "x"}, 1]}))
