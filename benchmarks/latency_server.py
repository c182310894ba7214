"""A loopback file server that answers like an object store far away: every request waits ``--latency`` seconds
(first-byte latency), then the file or the asked range is sent with sendfile (aiohttp's ``FileResponse``), or, with
``--bandwidth``, at most that many bytes a second per connection. Runs in a process of its own so that serving does
not take the benchmarked process's cores or GIL.

    python benchmarks/latency_server.py ROOT [--latency 0.04] [--bandwidth 50MB] [--port 0]

Prints ``{"url": "http://127.0.0.1:PORT"}`` on its first line when it listens. ``GET /_stats`` gives
``{"requests", "bytes", "in_flight_peak", "head", "cpu_seconds"}`` since the last ``POST /_reset``. Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import sys
import time
from pathlib import Path

from aiohttp import web

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


def parse_rate(text: str | None) -> float | None:
    if not text:
        return None
    match = re.match(r"^\s*([0-9.]+)\s*([kmg]?)b?\s*$", text.lower())
    if not match:
        raise SystemExit(f"--bandwidth: expected e.g. 50MB, got {text!r}")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


def make_app(root: Path, latency: float, bandwidth: float | None) -> web.Application:
    stats = {"requests": 0, "bytes": 0, "in_flight": 0, "in_flight_peak": 0, "head": 0,
             "cpu_mark": time.process_time()}

    @web.middleware
    async def slow(request: web.Request, handler):
        if request.path.startswith("/_"):
            return await handler(request)
        stats["requests"] += 1
        stats["head"] += request.method == "HEAD"
        stats["in_flight"] += 1
        stats["in_flight_peak"] = max(stats["in_flight_peak"], stats["in_flight"])
        try:
            if latency:
                await asyncio.sleep(latency)
            response = await handler(request)
            return response
        finally:
            stats["in_flight"] -= 1

    async def serve(request: web.Request) -> web.StreamResponse:
        path = (root / request.match_info["path"]).resolve()
        if root not in path.parents or not path.is_file():
            raise web.HTTPNotFound()
        size = path.stat().st_size
        header = request.headers.get("Range")
        if bandwidth is None:
            match = _RANGE.match(header or "")
            if match:
                end = int(match.group(2)) if match.group(2) else size - 1
                stats["bytes"] += min(end, size - 1) - int(match.group(1)) + 1
            elif request.method == "GET":
                stats["bytes"] += size
            return web.FileResponse(path)
        # capped: stream the range in slices, each after the time the cap allows
        start, end = 0, size - 1
        match = _RANGE.match(header or "")
        if match:
            start, end = int(match.group(1)), min(size - 1, int(match.group(2) or size - 1))
        response = web.StreamResponse(status=206 if match else 200)
        response.headers["Accept-Ranges"] = "bytes"
        response.headers["Content-Length"] = str(end - start + 1)
        if match:
            response.headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        slice_bytes = max(16384, int(bandwidth / 50))
        with open(path, "rb") as handle:
            handle.seek(start)
            left = end - start + 1
            while left > 0:
                data = handle.read(min(slice_bytes, left))
                await response.write(data)
                stats["bytes"] += len(data)
                left -= len(data)
                await asyncio.sleep(len(data) / bandwidth)
        await response.write_eof()
        return response

    async def get_stats(request: web.Request) -> web.Response:
        # the server's own CPU (user + system: sendfile's copies included) since the last reset: on a 2-core
        # machine it is taken from the benchmarked job
        return web.json_response({**{k: v for k, v in stats.items() if k not in ("in_flight", "cpu_mark")},
                                  "cpu_seconds": round(time.process_time() - stats["cpu_mark"], 2)})

    async def reset(request: web.Request) -> web.Response:
        for key in stats:
            if key != "in_flight":
                stats[key] = 0
        stats["cpu_mark"] = time.process_time()
        return web.json_response({})

    app = web.Application(middlewares=[slow])
    app.router.add_get("/_stats", get_stats)
    app.router.add_post("/_reset", reset)
    app.router.add_route("GET", "/{path:.*}", serve)
    app.router.add_route("HEAD", "/{path:.*}", serve)
    return app


async def main_async(args: argparse.Namespace) -> None:
    app = make_app(Path(args.root).resolve(), args.latency, parse_rate(args.bandwidth))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", args.port, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    print(json.dumps({"url": f"http://127.0.0.1:{port}"}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--latency", type=float, default=0.04)
    parser.add_argument("--bandwidth", default=None, help="bytes per second per connection, e.g. 50MB")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
