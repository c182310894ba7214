"""benchmarks/latency_server.py (the remote benchmark's object store): ranges, HEAD, 404/416, query strings,
keep-alive, stats and the latency, read with http.client, aiohttp's client and obstore."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LATENCY = 0.05
SIZE = 3_000_000


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    data = os.urandom(SIZE)
    (root / "file.bin").write_bytes(data)
    (root / "sub dir").mkdir()
    (root / "sub dir" / "small.bin").write_bytes(data[:1000])
    (root.parent / "outside.bin").write_bytes(b"secret")
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "latency_server.py"), str(root),
                             "--latency", str(LATENCY)], stdout=subprocess.PIPE, text=True)
    try:
        url = json.loads(proc.stdout.readline())["url"]
        yield url, data
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


def _connect(url: str) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=10)


def _ask(conn, method, path, headers=None):
    conn.request(method, path, headers=headers or {})
    answer = conn.getresponse()
    return answer, answer.read()


def test_ranges_head_errors_keep_alive_and_stats(served):
    url, data = served
    conn = _connect(url)
    assert _ask(conn, "POST", "/_reset")[1] == b"{}"
    for header, start, end in [("bytes=0-999", 0, 999), ("bytes=1000000-1499999", 1_000_000, 1_499_999),
                               (f"bytes={SIZE - 10}-{SIZE - 1}", SIZE - 10, SIZE - 1),
                               (f"bytes={SIZE - 100}-{SIZE + 100}", SIZE - 100, SIZE - 1),
                               ("bytes=2999000-", 2_999_000, SIZE - 1), ("bytes=-500", SIZE - 500, SIZE - 1)]:
        answer, body = _ask(conn, "GET", "/file.bin", {"Range": header})
        assert answer.status == 206, header
        assert body == data[start:end + 1], header
        assert answer.headers["Content-Range"] == f"bytes {start}-{end}/{SIZE}"
        assert answer.headers["Content-Length"] == str(end - start + 1)
        assert answer.headers["Accept-Ranges"] == "bytes"
    answer, body = _ask(conn, "GET", "/file.bin")
    assert answer.status == 200 and body == data and answer.headers["Content-Length"] == str(SIZE)
    answer, body = _ask(conn, "HEAD", "/file.bin")
    assert answer.status == 200 and body == b"" and answer.headers["Content-Length"] == str(SIZE)
    answer, body = _ask(conn, "GET", "/file.bin?sig=abc&se=2030", {"Range": "bytes=5-9"})
    assert answer.status == 206 and body == data[5:10]
    answer, body = _ask(conn, "GET", "/sub%20dir/small.bin")
    assert answer.status == 200 and body == data[:1000]
    for path in ["/missing.bin", "/../outside.bin", "/%2e%2e/outside.bin", "/sub%20dir", "/"]:
        assert _ask(conn, "GET", path)[0].status == 404, path
    answer, _ = _ask(conn, "GET", "/file.bin", {"Range": f"bytes={SIZE}-"})
    assert answer.status == 416 and answer.headers["Content-Range"] == f"bytes */{SIZE}"
    t0 = time.perf_counter()
    answer, body = _ask(conn, "GET", "/file.bin", {"Range": "bytes=0-0"})
    assert time.perf_counter() - t0 >= LATENCY and body == data[:1]
    stats = json.loads(_ask(conn, "GET", "/_stats")[1])  # all of it on one keep-alive connection
    assert stats["requests"] == 6 + 4 + 5 + 2 and stats["head"] == 1 and stats["in_flight_peak"] == 1
    assert stats["bytes"] == 1000 + 500_000 + 10 + 100 + 1000 + 500 + SIZE + 5 + 1000 + 1
    assert stats["cpu_seconds"] >= 0
    answer, body = _ask(conn, "GET", "/file.bin", {"Range": "bytes=0-3", "Connection": "close"})
    assert body == data[:4] and answer.headers["Connection"] == "close"
    conn.close()


def test_concurrent_requests_wait_the_latency_together(served):
    url, data = served

    async def main():
        import aiohttp

        async with aiohttp.ClientSession() as session:
            async def one(start):
                async with session.get(url + "/file.bin?x=1", headers={"Range": f"bytes={start}-{start + 99999}"}) as r:
                    assert r.status == 206
                    return await r.read()

            t0 = time.perf_counter()
            bodies = await asyncio.gather(*(one(i * 100_000) for i in range(20)))
            return time.perf_counter() - t0, bodies

    conn = _connect(url)
    _ask(conn, "POST", "/_reset")
    wall, bodies = asyncio.run(main())
    assert bodies == [data[i * 100_000:(i + 1) * 100_000] for i in range(20)]
    assert LATENCY <= wall < 10 * LATENCY  # not one after the other
    stats = json.loads(_ask(conn, "GET", "/_stats")[1])  # the same connection, idle meanwhile
    conn.close()
    assert stats["requests"] == 20 and stats["bytes"] == 2_000_000 and stats["in_flight_peak"] > 1


def test_obstore_reads_through_it(served):
    obstore = pytest.importorskip("obstore")
    from obstore.store import HTTPStore

    url, data = served
    store = HTTPStore.from_url(url, client_options={"allow_http": True})
    for start, length in [(0, 1000), (1_234_567, 400_000), (SIZE - 7, 7)]:
        assert bytes(obstore.get_range(store, "file.bin", start=start, length=length)) == data[start:start + length]
    assert bytes(obstore.get(store, "file.bin").bytes()) == data
    assert obstore.head(store, "file.bin")["size"] == SIZE
