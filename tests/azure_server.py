"""Azurite's blob service (Microsoft's Azure Storage emulator, an npm package) on a free loopback port.

Found as ``azurite-blob`` on ``$PATH``, under ``.ci/node`` (where ``.ci/run`` installs it when npm is there) or at
``$RASTERFLOW_AZURITE``; the tests that need it skip, saying so, when it is absent."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from stac_servers import free_port, stop_process

__all__ = ["azurite", "create_container", "ACCOUNT", "KEY"]

ACCOUNT = "devstoreaccount1"
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's well-known development account and key (public, the same in every install)."""

REPO = Path(__file__).resolve().parent.parent


def _executable() -> str | None:
    candidates = [os.environ.get("RASTERFLOW_AZURITE", ""), shutil.which("azurite-blob") or "",
                  str(REPO / ".ci" / "node" / "node_modules" / ".bin" / "azurite-blob")]
    return next((c for c in candidates if c and Path(c).exists()), None)


@contextmanager
def azurite() -> Iterator[str]:
    """Start Azurite's blob service on 127.0.0.1 and yield its blob endpoint
    (``http://127.0.0.1:<port>/devstoreaccount1``); stop it and remove its data on exit."""
    exe = _executable()
    if exe is None:
        pytest.skip("Azurite not installed (npm install --prefix .ci/node azurite@3; .ci/run does it when npm exists)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="azurite-") as data:
        proc = subprocess.Popen([exe, "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", data,
                                 "--silent", "--skipApiVersionCheck", "--loose"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("Azurite did not start") from None
                    time.sleep(0.2)
            yield f"http://127.0.0.1:{port}/{ACCOUNT}"
        finally:
            stop_process(proc)


def create_container(endpoint: str, name: str) -> None:
    """Create a container (obstore has no call for it), signed with the account key (Shared Key, as Azure
    documents it)."""
    import base64
    import hashlib
    import hmac
    import urllib.request
    from email.utils import formatdate

    date = formatdate(usegmt=True)
    version = "2021-08-06"
    canonical_headers = f"x-ms-date:{date}\nx-ms-version:{version}\n"
    canonical_resource = f"/{ACCOUNT}/{ACCOUNT}/{name}\nrestype:container"
    # the verb, then 11 standard headers, all empty here (a length of 0 is signed as ""), then ours and the resource
    to_sign = "PUT\n" + "\n" * 11 + canonical_headers + canonical_resource
    signature = base64.b64encode(hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()).decode()
    request = urllib.request.Request(f"{endpoint}/{name}?restype=container", method="PUT", headers={
        "x-ms-date": date, "x-ms-version": version, "Content-Length": "0",
        "Authorization": f"SharedKey {ACCOUNT}:{signature}"})
    urllib.request.urlopen(request, timeout=10).close()
