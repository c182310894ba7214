"""A Google Cloud Storage emulator (the pure-Python ``gcp-storage-emulator`` package, in the test extra) on a free
loopback port, in a process of its own; the tests that need it skip, saying so, when the package is absent.

It serves GCS's XML API (``/<bucket>/<object>``: GET with ``Range``, PUT) and its JSON API. What it does not do as
GCS does, found when pointing obstore's ``GCSStore`` at it (2026.7.19): a GET's answer has no ``Last-Modified`` and
no ``ETag`` header (object_store's GCS client refuses such an answer), a PUT's answer no ``ETag``, and HEAD on an
object is 501."""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from stac_servers import free_port

__all__ = ["gcs_emulator", "upload"]


@contextmanager
def gcs_emulator(bucket: str) -> Iterator[str]:
    """Start the emulator on 127.0.0.1 with ``bucket`` made, data in memory, and yield its base URL
    (``http://127.0.0.1:<port>``: what ``CPL_GS_ENDPOINT`` says); stop it on exit."""
    if importlib.util.find_spec("gcp_storage_emulator") is None:
        pytest.skip("gcp-storage-emulator not installed (it is in the test extra: pip install -e '.[test]')")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                             "--port", str(port), "--in-memory", "--default-bucket", bucket, "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the GCS emulator did not start") from None
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def upload(base_url: str, bucket: str, key: str, data: bytes) -> None:
    """Put an object with the XML API's PUT (obstore's own put wants an ``ETag`` the emulator does not send)."""
    request = urllib.request.Request(f"{base_url}/{bucket}/{key}", data=data, method="PUT",
                                     headers={"Content-Type": "image/tiff"})
    urllib.request.urlopen(request, timeout=30).close()
