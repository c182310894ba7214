"""Real STAC API servers on loopback, for tests.

Two context managers, each yielding the API root URL (``http://127.0.0.1:PORT/``) and tearing everything down on
exit (processes terminated, temp dirs removed):

``rustac_server(collection_json, items_ndjson)``
    ``rustac serve`` with its in-memory backend: starts in well under a second. It supports collections, bbox,
    datetime, ids and paging, but silently ignores ``query``, ``filter`` and ``sortby`` (it declares none of those
    conformance classes) and returns items grouped by collection in load order.

``pgstac_server(collection_json, items_ndjson)``
    A throw-away PostgreSQL 15 + PostGIS cluster with pgstac, served by stac-fastapi-pgstac under uvicorn: a full
    STAC API (query, filter (cql2-json over POST), sort, ...). About 2-3 s to start.

``collection_json`` may be one path or a sequence of paths (one collection per file). The server tools come from
``.ci/install-stac-server.sh``: PostgreSQL binaries in ``/usr/lib/postgresql/15/bin`` (env ``RASTERFLOW_PG_BIN``)
and a separate virtualenv (env ``RASTERFLOW_STAC_VENV``, default ``/opt/rasterflow-stac-venv``) with
``pypgstac`` and ``uvicorn``. When a tool is missing the context manager calls ``pytest.skip`` naming the install
script, or ``pytest.fail`` when ``CI=true`` (CI must never skip the server tests silently).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

__all__ = [
    "INSTALL_SCRIPT",
    "PG_BIN",
    "STAC_VENV",
    "free_port",
    "missing_pgstac_tools",
    "pgstac_server",
    "rustac_binary",
    "rustac_server",
    "skip_or_fail",
]

INSTALL_SCRIPT = ".ci/install-stac-server.sh"
STAC_VENV = Path(os.environ.get("RASTERFLOW_STAC_VENV", "/opt/rasterflow-stac-venv"))
PG_BIN = Path(os.environ.get("RASTERFLOW_PG_BIN", "/usr/lib/postgresql/15/bin"))
POSTGIS_CONTROL = Path("/usr/share/postgresql/15/extension/postgis.control")

PathLike = str | os.PathLike


def skip_or_fail(reason: str) -> None:
    """Skip the test (locally) or fail it (when ``CI=true``) because a server tool is missing."""
    msg = f"{reason}; run `bash {INSTALL_SCRIPT}` to install the STAC server tools"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the STAC server tests: {msg}", pytrace=False)
    pytest.skip(msg)


def rustac_binary() -> str | None:
    """The ``rustac`` CLI: next to the running interpreter (the project venv), else on PATH."""
    beside = Path(sys.executable).parent / "rustac"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("rustac")


def missing_pgstac_tools() -> list[str]:
    """What is missing for :func:`pgstac_server`, as readable strings (empty when all is there)."""
    missing = []
    for name in ("initdb", "pg_ctl", "postgres", "createdb"):
        if not os.access(PG_BIN / name, os.X_OK):
            missing.append(str(PG_BIN / name))
    if not POSTGIS_CONTROL.is_file():
        missing.append(f"PostGIS ({POSTGIS_CONTROL})")
    for name in ("pypgstac", "uvicorn"):
        if not os.access(STAC_VENV / "bin" / name, os.X_OK):
            missing.append(str(STAC_VENV / "bin" / name))
    return missing


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _paths(value: PathLike | Sequence[PathLike]) -> list[Path]:
    if isinstance(value, (str, os.PathLike)):
        return [Path(value).resolve()]
    return [Path(v).resolve() for v in value]


def _tail(path: Path, n: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float, what: str) -> None:
    """Poll ``url`` until it answers 200; fail fast when ``proc`` exits, give up after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before it was ready:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(0.05)
    raise RuntimeError(f"{what} not ready at {url} after {timeout:.0f} s ({last}):\n{_tail(log)}")


def stop_process(proc: subprocess.Popen | None, timeout: float = 10) -> None:
    """Terminate a server process and wait for it (killed after ``timeout`` s); nothing for None or an ended one."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def _run(cmd: list[str], *, log: Path, timeout: float, what: str, env: dict | None = None, cwd=None) -> None:
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            res = subprocess.run(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                timeout=timeout, env=env, cwd=cwd,
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{what} timed out after {timeout:.0f} s:\n{_tail(log)}") from None
    if res.returncode != 0:
        raise RuntimeError(f"{what} failed with exit code {res.returncode}:\n{_tail(log)}")


@contextlib.contextmanager
def rustac_server(
    collection_json: PathLike | Sequence[PathLike],
    items_ndjson: PathLike,
    *,
    timeout: float = 30,
) -> Iterator[str]:
    """``rustac serve`` (memory backend) on a free loopback port; yields the API root URL."""
    exe = rustac_binary()
    if exe is None:
        skip_or_fail("the rustac CLI was not found (it comes with the `rustac` Python package)")
    hrefs = [str(p) for p in _paths(collection_json)] + [str(Path(items_ndjson).resolve())]
    tmp = Path(tempfile.mkdtemp(prefix="rasterflow-rustac-"))
    log = tmp / "rustac.log"
    proc = None
    try:
        port = free_port()
        url = f"http://127.0.0.1:{port}/"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [exe, "serve", "--addr", f"127.0.0.1:{port}", *hrefs],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=tmp,
            )
        _wait_http(url, proc, log, timeout, "rustac serve")
        yield url
    finally:
        stop_process(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _as_postgres(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: drop to the ``postgres`` user when we are root."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


def _collections_ndjson(paths: list[Path], dest: Path) -> Path:
    lines = []
    for p in paths:
        value = json.loads(p.read_text())
        values = value if isinstance(value, list) else value.get("collections", [value])
        lines.extend(json.dumps(v) for v in values)
    dest.write_text("\n".join(lines) + "\n")
    return dest


@contextlib.contextmanager
def pgstac_server(
    collection_json: PathLike | Sequence[PathLike],
    items_ndjson: PathLike,
    *,
    timeout: float = 60,
) -> Iterator[str]:
    """A throw-away pgstac database served by stac-fastapi-pgstac; yields the API root URL.

    Steps (about 2-3 s): ``initdb`` in a temp dir (as ``postgres`` when root), ``pg_ctl start`` on a free port
    with fsync off and the unix socket in the temp dir, ``createdb``, ``pypgstac migrate``, ``pypgstac load
    collections|items --method insert_ignore``, then ``uvicorn stac_fastapi.pgstac.app:create_app --factory``.
    """
    missing = missing_pgstac_tools()
    if missing:
        skip_or_fail("STAC server tools missing: " + ", ".join(missing))
    colls = _paths(collection_json)
    items = Path(items_ndjson).resolve()

    tmp = Path(tempfile.mkdtemp(prefix="rfpg-"))  # short: the unix socket path must stay < 108 bytes
    data = tmp / "data"
    log = tmp / "setup.log"
    pg_log = tmp / "postgres.log"
    api_log = tmp / "api.log"
    if os.geteuid() == 0:
        shutil.chown(tmp, "postgres", "postgres")
    pg_started = False
    api = None
    try:
        pg_port = free_port()
        _run(
            _as_postgres([
                str(PG_BIN / "initdb"), "-D", str(data), "--auth=trust", "--no-sync", "-U", "postgres",
                "--encoding=UTF8", "--locale=C.UTF-8", "--no-instructions",
            ]),
            log=log, timeout=timeout, what="initdb",
        )
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {pg_port} -c unix_socket_directories={tmp} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        )
        _run(
            _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(pg_log), "-o", opts,
                          "-w", "-t", str(int(timeout)), "start"]),
            log=log, timeout=timeout + 5, what="pg_ctl start",
        )
        pg_started = True

        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "POSTGRES"))}
        env.update(PGHOST="127.0.0.1", PGPORT=str(pg_port), PGUSER="postgres", PGPASSWORD="postgres",
                   PGDATABASE="pgstac")
        dsn = f"postgresql://postgres:postgres@127.0.0.1:{pg_port}/pgstac"
        _run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(pg_port), "-U", "postgres", "pgstac"],
             log=log, timeout=timeout, what="createdb", env=env)
        pypgstac = str(STAC_VENV / "bin" / "pypgstac")
        _run([pypgstac, "migrate", "--dsn", dsn], log=log, timeout=timeout, what="pypgstac migrate", env=env)
        colls_file = _collections_ndjson(colls, tmp / "collections.ndjson")
        _run([pypgstac, "load", "collections", str(colls_file), "--dsn", dsn, "--method", "insert_ignore"],
             log=log, timeout=timeout, what="pypgstac load collections", env=env)
        _run([pypgstac, "load", "items", str(items), "--dsn", dsn, "--method", "insert_ignore"],
             log=log, timeout=timeout, what="pypgstac load items", env=env)

        port = free_port()
        url = f"http://127.0.0.1:{port}/"
        with open(api_log, "wb") as out:
            api = subprocess.Popen(
                [str(STAC_VENV / "bin" / "uvicorn"), "stac_fastapi.pgstac.app:create_app", "--factory",
                 "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=tmp,
            )
        _wait_http(url, api, api_log, timeout, "stac-fastapi-pgstac")
        yield url
    finally:
        stop_process(api)
        if pg_started:
            subprocess.run(
                _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=30,
            )
        shutil.rmtree(tmp, ignore_errors=True)
