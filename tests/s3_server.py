"""moto's standalone S3 server (``moto_server``, from the test extra) on a free loopback port, for the fixtures."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from stac_servers import free_port

__all__ = ["moto_server"]


@contextmanager
def moto_server() -> Iterator[str]:
    """Start ``moto_server`` on 127.0.0.1 and yield its endpoint URL (``http://127.0.0.1:<port>``); stop it on exit."""
    exe = Path(sys.executable).parent / "moto_server"
    if not exe.exists():
        pytest.skip("moto_server not installed (pip install 'moto[server]>=5,<6', the test extra)")
    port = free_port()
    proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(endpoint + "/moto-api/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)
