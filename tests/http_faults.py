"""A loopback HTTP server for remote-read tests: static files with range requests, or a reverse proxy, with
deterministic injectable faults and a request count per path.

``fault_server(root=..., faults=[...])`` serves the files under ``root`` (HEAD and GET, single and multiple byte
ranges, as a static file host or an object store does). ``fault_server(upstream=url, ...)`` forwards every request
to ``upstream`` instead (e.g. ``rustac serve``) and rewrites the upstream's address to its own in the bodies, so
the links a STAC API returns (``next`` pages, ``self``) come back through the proxy.

Faults are rules (:class:`Fault`), checked in order for every request; the first that fires decides the answer.
Whether a rule fires depends only on the path, the 1-based number of the request to that path and the rule's
seed, never on timing or thread interleaving:

* ``nth={1, 2}``: the 1st and 2nd requests to a matching path;
* ``fraction=0.05, seed=7``: a pseudo-random 5 % of the requests (a hash of seed, path and request number);
* ``always=True``: every request.

Kinds: ``status`` (e.g. 503, 500, 429, 404, 403, with an optional ``Retry-After``), ``reset`` (the connection is
closed with a TCP RST before any byte of the answer), ``truncate`` (headers and part of the body, then RST),
``stall`` (wait ``seconds``, then answer normally: a timeout for a client that waits less) and ``bad_range`` (a 206
whose ``Content-Range`` and body are the range one byte further on, or one byte before for a range that ends the
file: a proxy or cache that mixed up answers). ``latency`` adds a
delay to every request (benchmarks).

The server counts requests per path (``server.count(path)``) and logs ``(method, path, range, status)`` per
request (``server.log``); faults answered count too. ``server.in_flight_peak`` is the most requests it was
answering at once (latency included) since the last ``reset_counts``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import http.client
import os
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["Fault", "FaultServer", "fault_server", "http_items"]


@dataclass
class Fault:
    """One fault rule: which requests (``path`` glob, ``method``, ``nth`` / ``fraction`` / ``always``) get what."""

    kind: str
    """``status`` | ``reset`` | ``truncate`` | ``stall``."""
    path: str = "*"
    """A glob matched against the request path (no query string), e.g. ``*/red.tif`` or ``/search``."""
    status: int = 503
    retry_after: int | None = None
    """Whole seconds sent as ``Retry-After`` with a ``status`` fault."""
    nth: frozenset[int] | set[int] = field(default_factory=frozenset)
    fraction: float = 0.0
    seed: int = 0
    always: bool = False
    method: str | None = None
    """Only requests with this method (``GET``, ``POST``, ``HEAD``); None = any."""
    seconds: float = 5.0
    """How long a ``stall`` waits before answering."""
    ranged_only: bool = False
    """Only requests with a Range header (data reads, not the first header read of a file)."""
    unless_query: str | None = None
    """Only requests whose query string lacks this text (e.g. a 403 for URLs that are not signed)."""

    def fires(self, method: str, path: str, number: int, ranged: bool, query: str = "") -> bool:
        if self.method is not None and method != self.method:
            return False
        if self.unless_query is not None and self.unless_query in query:
            return False
        if self.ranged_only and not ranged:
            return False
        if not fnmatch.fnmatchcase(path, self.path):
            return False
        if self.always or number in self.nth:
            return True
        if self.fraction > 0:
            digest = hashlib.sha256(f"{self.seed}:{path}:{number}".encode()).digest()
            return int.from_bytes(digest[:8], "big") / 2**64 < self.fraction
        return False


class FaultServer(ThreadingHTTPServer):
    """The server; see the module docstring. Thread-safe counters; faults may be replaced while it runs."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 512  # socketserver's default of 5 resets connections a concurrent reader opens at once

    def handle_error(self, request, client_address) -> None:
        """A client that went away mid-answer (a reader that cancels its requests when its task fails) is normal:
        no traceback on stderr (a test's captured output would show one); anything else as socketserver does."""
        import sys

        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
            return
        super().handle_error(request, client_address)

    def __init__(self, root: Path | None, upstream: str | None, faults: Sequence[Fault], latency: float):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = Path(root).resolve() if root is not None else None
        self.upstream = upstream.rstrip("/") if upstream else None
        self.faults = list(faults)
        self.latency = latency
        self.counts: Counter[str] = Counter()
        self.log: list[tuple[str, str, str | None, int | str]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.in_flight_peak = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def count(self, path: str | None = None) -> int:
        """Requests to ``path`` (a glob; every path when None) so far."""
        with self.lock:
            if path is None:
                return sum(self.counts.values())
            return sum(n for p, n in self.counts.items() if fnmatch.fnmatchcase(p, path))

    def statuses(self, path: str = "*") -> Counter:
        """How often each answer (status code, ``reset``, ...) was given to requests matching ``path``."""
        with self.lock:
            return Counter(status for _, p, _, status in self.log if fnmatch.fnmatchcase(p, path))

    def reset_counts(self) -> None:
        with self.lock:
            self.counts.clear()
            self.log.clear()
            self.in_flight_peak = 0

    def _number(self, path: str) -> int:
        with self.lock:
            self.counts[path] += 1
            return self.counts[path]

    def _record(self, method: str, path: str, ranged: str | None, status: int | str) -> None:
        with self.lock:
            self.log.append((method, path, ranged, status))


class _Handler(BaseHTTPRequestHandler):
    server: FaultServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # quiet: the server keeps its own log
        pass

    def do_HEAD(self) -> None:
        self._handle()

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    # ---- the fault decision -----------------------------------------------------------------------------------

    def _handle(self) -> None:
        server = self.server
        with server.lock:
            server.in_flight += 1
            server.in_flight_peak = max(server.in_flight_peak, server.in_flight)
        try:
            self._handle_counted()
        finally:
            with server.lock:
                server.in_flight -= 1

    def _handle_counted(self) -> None:
        server = self.server
        path = unquote(urlsplit(self.path).path)
        body = self._request_body()
        number = server._number(path)
        ranged = self.headers.get("Range")
        if server.latency:
            time.sleep(server.latency)
        for fault in list(server.faults):
            if not fault.fires(self.command, path, number, ranged is not None, urlsplit(self.path).query):
                continue
            if fault.kind == "status":
                server._record(self.command, path, ranged, fault.status)
                payload = f'{{"code": "Injected", "description": "injected HTTP {fault.status}"}}'.encode()
                self.send_response(fault.status)
                self.send_header("Content-Type", "application/json")
                if fault.retry_after is not None:
                    self.send_header("Retry-After", str(int(fault.retry_after)))  # RFC 9110: whole seconds
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)
                return
            if fault.kind == "reset":
                server._record(self.command, path, ranged, "reset")
                self._reset()
                return
            if fault.kind == "truncate":
                server._record(self.command, path, ranged, "truncate")
                self._answer(path, body, truncate=True)
                return
            if fault.kind == "stall":
                time.sleep(fault.seconds)
                break
            if fault.kind == "bad_range" and ranged:
                server._record(self.command, path, ranged, "bad_range")
                self._answer(path, body, shift=1)
                return
            raise ValueError(f"unknown fault kind {fault.kind!r}")
        self._answer(path, body)

    def _request_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _reset(self) -> None:
        """Close the connection with a TCP RST (SO_LINGER 0): the client sees 'connection reset by peer'."""
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.close()

    def _answer(self, path: str, body: bytes, truncate: bool = False, shift: int = 0) -> None:
        if self.server.upstream is not None:
            status, headers, payload = self._forward(body)
        else:
            status, headers, payload = self._static(path, shift)
        if not truncate:
            self.server._record(self.command, path, self.headers.get("Range"), status)
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command == "HEAD":
            return
        if truncate:
            self.wfile.write(payload[: max(1, len(payload) // 2)])
            self.wfile.flush()
            self._reset()
            return
        self.wfile.write(payload)

    # ---- static files with ranges -----------------------------------------------------------------------------

    def _static(self, path: str, shift: int = 0) -> tuple[int, list[tuple[str, str]], bytes]:
        root = self.server.root
        assert root is not None
        target = (root / path.lstrip("/")).resolve()
        if root not in target.parents or not target.is_file():
            return 404, [("Content-Type", "text/plain")], b"not found"
        data = target.read_bytes()
        size = len(data)
        base = [("Accept-Ranges", "bytes"), ("Last-Modified", "Mon, 01 Jan 2024 00:00:00 GMT")]
        spec = self.headers.get("Range")
        if not spec or not spec.startswith("bytes="):
            return 200, [*base, ("Content-Type", "image/tiff")], data
        ranges = []
        for part in spec[len("bytes="):].split(","):
            start_text, _, end_text = part.strip().partition("-")
            if start_text == "":
                start, end = max(0, size - int(end_text)), size - 1
            else:
                start = int(start_text)
                end = min(int(end_text), size - 1) if end_text else size - 1
            if start >= size or start > end:
                return 416, [*base, ("Content-Range", f"bytes */{size}")], b""
            if shift and end + shift < size:
                start, end = start + shift, end + shift
            elif shift and start - shift >= 0:  # a range that ends the file: one byte before it, wrong all the same
                start, end = start - shift, end - shift
            ranges.append((start, end))
        if len(ranges) == 1:
            start, end = ranges[0]
            return 206, [*base, ("Content-Type", "image/tiff"), ("Content-Range", f"bytes {start}-{end}/{size}")], \
                data[start:end + 1]
        boundary = "rasterflowboundary"
        parts = []
        for start, end in ranges:
            parts.append(f"--{boundary}\r\nContent-Type: image/tiff\r\nContent-Range: bytes {start}-{end}/{size}"
                         f"\r\n\r\n".encode() + data[start:end + 1] + b"\r\n")
        payload = b"".join(parts) + f"--{boundary}--\r\n".encode()
        return 206, [*base, ("Content-Type", f"multipart/byteranges; boundary={boundary}")], payload

    # ---- reverse proxy ----------------------------------------------------------------------------------------

    def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        upstream = urlsplit(self.server.upstream)
        connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "accept-encoding")}
        try:
            connection.request(self.command, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
            payload = response.read()
            kept = [(k, v) for k, v in response.getheaders()
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding")]
            status = response.status
        finally:
            connection.close()
        # links come back through the proxy (the upstream may write its own address, or its host header's)
        payload = payload.replace(self.server.upstream.encode(), self.server.url.encode())
        return status, kept, payload


@contextlib.contextmanager
def fault_server(root: str | os.PathLike | None = None, *, upstream: str | None = None,
                 faults: Sequence[Fault] = (), latency: float = 0.0) -> Iterator[FaultServer]:
    """Start a :class:`FaultServer` on a free loopback port in a background thread; stop it on exit."""
    if (root is None) == (upstream is None):
        raise ValueError("give exactly one of root (static files) or upstream (proxy)")
    server = FaultServer(Path(root) if root is not None else None, upstream, faults, latency)
    thread = threading.Thread(target=server.serve_forever, name="fault-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def http_items(sample, base_url: str, dest: str | os.PathLike, *, rewrite=None) -> Path:
    """Write ``sample``'s items file with every asset href under ``sample.directory`` moved to ``base_url``.

    ``rewrite(href) -> href`` may change the result further (e.g. to point one asset at a missing file).
    """
    import json

    collection = json.loads(Path(sample.items_json).read_text())
    root = Path(sample.directory)
    for item in collection["features"]:
        for asset in item["assets"].values():
            href = asset.get("href", "")
            if href and Path(href).is_absolute() and root in Path(href).parents:
                asset["href"] = f"{base_url.rstrip('/')}/{Path(href).relative_to(root).as_posix()}"
                if rewrite is not None:
                    asset["href"] = rewrite(asset["href"])
    dest = Path(dest)
    dest.write_text(json.dumps(collection))
    return dest
