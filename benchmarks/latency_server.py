"""A loopback file server that answers like an object store far away: every request waits ``--latency`` seconds
(first-byte latency), then the file or the asked range is sent with ``loop.sendfile`` (zero-copy), or, with
``--bandwidth``, at most that many bytes a second per connection. Runs in a process of its own so that serving does
not take the benchmarked process's GIL, and is lean (plain asyncio, a minimal HTTP/1.1 keep-alive parser, files
kept open) so that it takes little of the benchmarked job's cores: a real object store's CPU is not ours.

    python benchmarks/latency_server.py ROOT [--latency 0.04] [--bandwidth 50MB] [--port 0]

Prints ``{"url": "http://127.0.0.1:PORT"}`` on its first line when it listens. GET and HEAD of files under ROOT
(query strings ignored, as for signed URLs), ``Range: bytes=START-END``, ``bytes=START-`` and ``bytes=-N``.
``GET /_stats`` gives ``{"requests", "bytes", "in_flight_peak", "head", "cpu_seconds"}`` since the last
``POST /_reset`` (neither is delayed nor counted). Stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import stat
import sys
import time
from collections import OrderedDict
from email.utils import formatdate
from pathlib import Path
from urllib.parse import unquote

_RANGE = re.compile(rb"bytes=(\d*)-(\d*)$")
_REASONS = {200: "OK", 206: "Partial Content", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            416: "Range Not Satisfiable", 431: "Request Header Fields Too Large"}
_MAX_HEAD = 65536
_OPEN_FILES = 256


def parse_rate(text: str | None) -> float | None:
    if not text:
        return None
    match = re.match(r"^\s*([0-9.]+)\s*([kmg]?)b?\s*$", text.lower())
    if not match:
        raise SystemExit(f"--bandwidth: expected e.g. 50MB, got {text!r}")
    return float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[match.group(2)]


class _File:
    """An open file of the cache; closed when evicted (or replaced on disk) and no request uses it any more."""

    __slots__ = ("evicted", "handle", "headers", "key", "size", "users")

    def __init__(self, path: str, st: os.stat_result):
        self.handle = open(path, "rb", buffering=0)  # noqa: SIM115 (kept open: closed by release/evict)
        self.size = st.st_size
        self.key = (st.st_ino, st.st_mtime_ns, st.st_size)
        self.headers = (f"Accept-Ranges: bytes\r\nContent-Type: application/octet-stream\r\n"
                        f"Last-Modified: {formatdate(st.st_mtime, usegmt=True)}\r\n"
                        f'ETag: "{st.st_ino:x}-{st.st_mtime_ns:x}-{st.st_size:x}"\r\n')
        self.users = 0
        self.evicted = False

    def release(self) -> None:
        self.users -= 1
        if self.evicted and not self.users:
            self.handle.close()


class Server:
    def __init__(self, root: Path, latency: float, bandwidth: float | None):
        self.root = str(root.resolve())
        self.latency = latency
        self.bandwidth = bandwidth
        self.stats = {"requests": 0, "bytes": 0, "in_flight_peak": 0, "head": 0}
        self.in_flight = 0
        self.cpu_mark = time.process_time()
        self.paths: dict[str, str | None] = {}  # URL path -> resolved file path (None: outside ROOT)
        self.files: OrderedDict[str, _File] = OrderedDict()  # resolved path -> open file, least recent first
        self.connections: set[_Connection] = set()

    def reset(self) -> None:
        self.stats.update(dict.fromkeys(self.stats, 0))  # in place: requests in flight count in the new round
        self.cpu_mark = time.process_time()

    def stats_json(self) -> bytes:
        # the server's own CPU (user + system: sendfile's copies included) since the last reset: on a 2-core
        # machine it is taken from the benchmarked job
        return json.dumps({**self.stats, "cpu_seconds": round(time.process_time() - self.cpu_mark, 3)}).encode()

    def open(self, url_path: str) -> _File | None:
        """The open file for a URL path (already URL-decoded), or None: missing, not a file, or outside ROOT."""
        path = self.paths.get(url_path, "")
        if path == "":
            try:
                resolved = os.path.realpath(os.path.join(self.root, url_path.lstrip("/")))
            except ValueError:  # a NUL in the path
                resolved = ""
            path = resolved if resolved.startswith(self.root + os.sep) else None
            if len(self.paths) > 65536:
                self.paths.clear()
            self.paths[url_path] = path
        if path is None:
            return None
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        entry = self.files.get(path)
        if entry is not None and entry.key != (st.st_ino, st.st_mtime_ns, st.st_size):
            self._evict(path)
            entry = None
        if entry is None:
            try:
                entry = _File(path, st)
            except OSError:
                return None
            self.files[path] = entry
            while len(self.files) > _OPEN_FILES:
                self._evict(next(iter(self.files)))
        else:
            self.files.move_to_end(path)
        entry.users += 1
        return entry

    def _evict(self, path: str) -> None:
        entry = self.files.pop(path)
        entry.evicted = True
        if not entry.users:
            entry.handle.close()

    def close(self) -> None:
        for connection in list(self.connections):
            connection.transport.abort()
        for path in list(self.files):
            self._evict(path)


class _Connection(asyncio.Protocol):
    """One client connection: requests are answered one after the other (a pipelined one waits in the buffer)."""

    def __init__(self, server: Server):
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.buffer = bytearray()
        self.busy = False
        self.task: asyncio.Task | None = None
        self.transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.fd = transport.get_extra_info("socket").fileno()
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while not self.busy and not self.transport.is_closing() and self._next():
            pass

    def _next(self) -> bool:
        """Handles the next complete request in the buffer, if there is one: at once for a small answer (then True:
        look for another), or by starting the file's answer (then ``busy`` until it is sent)."""
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > _MAX_HEAD:
                self._simple(431, b"", close=True)
            return False
        lines = bytes(self.buffer[:end]).split(b"\r\n")
        parts = lines[0].split(b" ")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        length = headers.get(b"content-length", b"0")
        if (len(parts) != 3 or not parts[2].startswith(b"HTTP/1.") or not length.isdigit()
                or b"transfer-encoding" in headers):  # no request bodies but Content-Length ones (none expected)
            self._simple(400, b"", close=True)
            return False
        if len(self.buffer) < end + 4 + int(length):
            return False  # the body is still on its way
        del self.buffer[:end + 4 + int(length)]
        method, target, version = parts
        connection = headers.get(b"connection", b"").lower()
        close = connection == b"close" if version == b"HTTP/1.1" else connection != b"keep-alive"
        path = unquote(target.partition(b"?")[0].decode("utf-8", "surrogateescape"))
        if path.startswith("/_"):
            if path == "/_stats" and method == b"GET":
                self._simple(200, self.server.stats_json(), close, b"application/json")
            elif path == "/_reset" and method == b"POST":
                self.server.reset()
                self._simple(200, b"{}", close, b"application/json")
            else:
                self._simple(404, b"", close)
            return True
        if method not in (b"GET", b"HEAD"):
            self._simple(405, b"", close)
            return True
        self.busy = True
        self.task = self.loop.create_task(self._serve(method == b"HEAD", path, headers.get(b"range"), close))
        return False

    def _simple(self, status: int, body: bytes, close: bool, kind: bytes = b"text/plain") -> None:
        """Answers with a small body at once (and closes the connection if asked)."""
        self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n%s" % (
            status, _REASONS[status].encode(), kind, len(body), b"Connection: close\r\n" if close else b"", body))
        if close:
            self.transport.close()

    def _sendfile_now(self, handle, offset: int, count: int) -> int:
        """What one ``os.sendfile`` puts in the socket's buffer now (what ``loop.sendfile`` would do first, without
        its pause of reading and waits), 0 if the transport still holds bytes to send or the socket is full."""
        if self.transport.get_write_buffer_size():
            return 0
        try:
            return os.sendfile(self.fd, handle.fileno(), offset, count)
        except (BlockingIOError, InterruptedError):
            return 0

    async def _serve(self, head: bool, path: str, range_header: bytes | None, close: bool) -> None:
        server = self.server
        stats = server.stats
        stats["requests"] += 1
        stats["head"] += head
        server.in_flight += 1
        stats["in_flight_peak"] = max(stats["in_flight_peak"], server.in_flight)
        entry = None
        try:
            if server.latency:
                await asyncio.sleep(server.latency)
            entry = server.open(path)
            if entry is None:
                return self._simple(404, b"", close)
            size = entry.size
            start, end, status = 0, size - 1, 200
            match = _RANGE.match(range_header) if range_header else None
            if match and (match.group(1) or match.group(2)):
                if match.group(1):
                    start = int(match.group(1))
                    end = min(end, int(match.group(2))) if match.group(2) else end
                else:  # bytes=-N: the last N bytes
                    start = max(0, size - int(match.group(2)))
                if start >= size or end < start:
                    self.transport.write(b"HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */%d\r\n"
                                         b"Content-Length: 0\r\n%s\r\n" % (size, b"Connection: close\r\n" if close else b""))
                    return
                status = 206
            count = end - start + 1
            self.transport.write((
                f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Length: {count}\r\n{entry.headers}"
                + (f"Content-Range: bytes {start}-{end}/{size}\r\n" if status == 206 else "")
                + ("Connection: close\r\n" if close else "") + "\r\n").encode())
            if head or not count:
                return
            if server.bandwidth is None:
                # zero-copy, at once while the transport has nothing queued (the headers went out in write());
                # what the socket's buffer did not take goes through loop.sendfile, which waits for it to drain
                sent = self._sendfile_now(entry.handle, start, count)
                if sent < count:
                    sent += await self.loop.sendfile(self.transport, entry.handle, start + sent, count - sent)
                stats["bytes"] += sent  # not `+= await`: that would add to the value read before the wait
                return
            # capped: the range in slices, each after the time the cap allows
            step = max(16384, int(server.bandwidth / 50))
            while count > 0:
                sent = await self.loop.sendfile(self.transport, entry.handle, start, min(step, count))
                stats["bytes"] += sent
                start += sent
                count -= sent
                await asyncio.sleep(sent / server.bandwidth)
        except (ConnectionError, RuntimeError):  # the client went away (RuntimeError: "Transport is closing")
            close = True
            self.transport.abort()
        finally:
            server.in_flight -= 1
            if entry is not None:
                entry.release()
            self.busy = False
            self.task = None
            if close:
                self.transport.close()
            elif self.buffer:
                self.data_received(b"")


async def start(root: Path, latency: float, bandwidth: float | None, port: int = 0,
                host: str = "127.0.0.1") -> tuple[asyncio.base_events.Server, Server]:
    state = Server(root, latency, bandwidth)
    listener = await asyncio.get_running_loop().create_server(lambda: _Connection(state), host, port, backlog=1024)
    return listener, state


async def main_async(args: argparse.Namespace) -> None:
    listener, state = await start(Path(args.root), args.latency, parse_rate(args.bandwidth), args.port)
    port = listener.sockets[0].getsockname()[1]
    print(json.dumps({"url": f"http://127.0.0.1:{port}"}), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    listener.close()
    state.close()
    await listener.wait_closed()


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
