"""GDAL settings for reading COGs over HTTP(S) and S3, as cloud-native readers set them.

Pure (stdlib only): the reader puts :func:`remote_read_options` into a ``rasterio.Env`` around every open and read,
the LocalCluster puts :func:`process_env` into each worker's environment before GDAL starts (some settings, like
the size of GDAL's shared HTTP cache, are read once per process), and the run report lists both.

A variable the user already set in the environment wins: it is left out of what rasterflow sets, so GDAL reads the
user's value (``GDAL_HTTP_MULTIPLEX=NO`` for a proxy that breaks HTTP/2, say).

S3 (``s3://bucket/key`` -> ``/vsis3/bucket/key``) takes its credentials and options from the standard environment,
as GDAL and boto users expect: ``AWS_PROFILE``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``, ``AWS_NO_SIGN_REQUEST=YES`` for public buckets,
``AWS_REQUEST_PAYER=requester``, and a custom endpoint as GDAL spells it (``AWS_S3_ENDPOINT=host:port`` with
``AWS_HTTPS`` / ``AWS_VIRTUAL_HOSTING``) or as boto spells it (``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``, e.g.
``http://127.0.0.1:9000``: translated here into GDAL's three variables).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from urllib.parse import urlsplit

__all__ = [
    "REMOTE_READ_DEFAULTS", "VSI_CACHE_SIZE", "CURL_CACHE_SIZE", "remote_read_options", "process_env",
    "aws_endpoint_options", "allowed_extensions", "AWS_ENV_NAMES", "aws_env_summary", "PROCESS_KEYS",
    "when_gdal_loads", "BlockCache", "gdal_loaded",
]

VSI_CACHE_SIZE = 1_000_000
"""Bytes of file cache GDAL keeps per open file. GDAL's default is 25 MB *per file handle*, and files stay open for
the job (108 files -> 2.7 GB per thread); 1 MB holds a COG header and its tile index."""

CURL_CACHE_SIZE = 64 * 1024 * 1024
"""Bytes of GDAL's process-wide cache of downloaded ranges (GDAL's default is 16 MB): bounded, and a few chunks'
worth of compressed tiles, so neighbouring chunks that share a COG tile fetch it once."""

REMOTE_READ_DEFAULTS: dict[str, str] = {
    # no directory listing when a file is opened: a COG needs none, and listing a bucket prefix costs requests
    "GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR",
    "VSI_CACHE": "TRUE",
    "VSI_CACHE_SIZE": str(VSI_CACHE_SIZE),
    "CPL_VSIL_CURL_CACHE_SIZE": str(CURL_CACHE_SIZE),
    # adjacent tiles of one window in one request
    "GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES",
    # parallel range requests over one HTTP/2 connection where the server speaks it
    "GDAL_HTTP_MULTIPLEX": "YES",
    # rasterflow retries (source.retry): counted, with GDAL's cached failure cleared in between; GDAL's own
    # silent retries would hide the failures from the run report and retry files a cached failure then blocks
    "GDAL_HTTP_MAX_RETRY": "0",
}
"""What rasterflow sets for every read (unless the environment says otherwise)."""

AWS_ENV_NAMES = (
    "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_S3_ENDPOINT", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
    "AWS_HTTPS", "AWS_VIRTUAL_HOSTING", "AWS_NO_SIGN_REQUEST", "AWS_REQUEST_PAYER", "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
)
_AWS_SECRETS = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"})


def aws_endpoint_options(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """GDAL's ``AWS_S3_ENDPOINT`` / ``AWS_HTTPS`` / ``AWS_VIRTUAL_HOSTING`` from boto's ``AWS_ENDPOINT_URL[_S3]``.

    Empty when GDAL's own ``AWS_S3_ENDPOINT`` is set or no endpoint URL is. A custom endpoint (MinIO, moto, Ceph)
    is addressed path-style unless ``AWS_VIRTUAL_HOSTING`` says otherwise.
    """
    env = os.environ if environ is None else environ
    url = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if not url or env.get("AWS_S3_ENDPOINT"):
        return {}
    parts = urlsplit(url if "://" in url else f"https://{url}")
    options = {"AWS_S3_ENDPOINT": parts.netloc + parts.path.rstrip("/")}
    if "AWS_HTTPS" not in env:
        options["AWS_HTTPS"] = "NO" if parts.scheme == "http" else "YES"
    if "AWS_VIRTUAL_HOSTING" not in env:
        options["AWS_VIRTUAL_HOSTING"] = "FALSE"
    return options


def allowed_extensions(hrefs: Iterable[str]) -> str | None:
    """``CPL_VSIL_CURL_ALLOWED_EXTENSIONS`` for a job's files: the suffixes of its hrefs (query strings of signed
    URLs ignored), so GDAL never probes side-car files (``.aux.xml``, ``.ovr``, ``.msk``) over the network; None
    when some href has no suffix (then GDAL would refuse that file, so nothing is restricted)."""
    suffixes = set()
    for href in hrefs:
        path = urlsplit(href).path if "://" in href else href
        name = path.rsplit("/", 1)[-1]
        if "." not in name:
            return None
        suffixes.add("." + name.rsplit(".", 1)[-1])
    return ",".join(sorted(suffixes)) if suffixes else None


def remote_read_options(*, timeout: float | None = None, extensions: str | None = None,
                        environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The GDAL config options of a remote read: :data:`REMOTE_READ_DEFAULTS`, the request timeout, the allowed
    extensions and the S3 endpoint, minus what ``environ`` (default ``os.environ``) sets itself."""
    env = os.environ if environ is None else environ
    options = dict(REMOTE_READ_DEFAULTS)
    if timeout is not None:
        # a stalled request becomes a timeout, which is transient and retried
        options["GDAL_HTTP_TIMEOUT"] = str(max(1, int(round(timeout))))
        options["GDAL_HTTP_CONNECTTIMEOUT"] = str(max(1, int(round(min(timeout, 10.0)))))
    if extensions:
        options["CPL_VSIL_CURL_ALLOWED_EXTENSIONS"] = extensions
    options.update(aws_endpoint_options(env))
    return {key: value for key, value in options.items() if key not in env}


PROCESS_KEYS = ("CPL_VSIL_CURL_CACHE_SIZE",)
"""Settings GDAL reads once per process (when its HTTP file system starts): they go into the workers'
environment; the others are set around each read, per run."""


def process_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a worker process gets in its environment before GDAL starts: the per-process settings, unless set."""
    options = remote_read_options(environ=environ)
    return {key: options[key] for key in PROCESS_KEYS if key in options}


def aws_env_summary(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The S3-related variables set in the environment, for the run report: values of the non-secret ones, and
    ``"(set)"`` for credentials."""
    env = os.environ if environ is None else environ
    return {name: ("(set)" if name in _AWS_SECRETS else env[name]) for name in AWS_ENV_NAMES if name in env}


# ---- settings applied when GDAL loads -----------------------------------------------------------------------------
#
# A worker that reads only files rasterflow decodes itself (local tiled COGs, remote COGs through the concurrent
# reader) never imports rasterio, so it never loads GDAL (~30-45 MB of RSS, plus its block cache). What must be set
# in GDAL (its block cache size) is set when rasterio is first imported in the process, not by importing it.

_PENDING: list[Callable[[], None]] = []
_PENDING_LOCK = threading.RLock()


def gdal_loaded() -> bool:
    """Whether rasterio (and so GDAL) is imported in this process."""
    return "rasterio" in sys.modules


class _RasterioWatch(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of the ``rasterio`` package so that the callbacks of
    :func:`when_gdal_loads` run once its import has finished."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "rasterio":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if loader is None or exec_module is None:
            return spec

        def run_then_apply(module: ModuleType) -> None:
            exec_module(module)
            _run_pending()

        loader.exec_module = run_then_apply  # type: ignore[method-assign]  # this spec's own loader instance
        return spec


_WATCH = _RasterioWatch()


def _run_pending() -> None:
    with _PENDING_LOCK:
        callbacks = list(_PENDING)
        _PENDING.clear()
        if _WATCH in sys.meta_path:
            sys.meta_path.remove(_WATCH)
    for callback in callbacks:
        callback()


def when_gdal_loads(callback: Callable[[], None]) -> None:
    """Run ``callback`` now when rasterio is imported in this process, else right after its first import (an
    import hook: no import here)."""
    with _PENDING_LOCK:
        if not gdal_loaded():
            _PENDING.append(callback)
            if _WATCH not in sys.meta_path:
                sys.meta_path.insert(0, _WATCH)
            return
    callback()


def _cancel(callback: Callable[[], None]) -> bool:
    """Drop ``callback`` if it has not run yet; whether it was pending."""
    with _PENDING_LOCK:
        if callback in _PENDING:
            _PENDING.remove(callback)
            if not _PENDING and _WATCH in sys.meta_path:
                sys.meta_path.remove(_WATCH)
            return True
    return False


class BlockCache:
    """GDAL's block cache of this process set to ``nbytes`` (``GDALSetCacheMax64`` through
    ``rasterio.env.set_gdal_config``, which takes effect even when GDAL has started): at once when rasterio is
    imported, else when it is first imported (:func:`when_gdal_loads`; a process that never loads GDAL has no block
    cache to size). :meth:`restore` puts the size it replaced back."""

    def __init__(self, nbytes: int):
        self.nbytes = int(nbytes)
        self.previous: int | None = None
        """GDAL's size before :meth:`apply` took effect (None: not yet)."""

    def apply(self) -> None:
        when_gdal_loads(self._set)

    def _set(self) -> None:
        import rasterio.env

        self.previous = int(rasterio.env.get_gdal_config("GDAL_CACHEMAX"))
        rasterio.env.set_gdal_config("GDAL_CACHEMAX", self.nbytes)

    def restore(self) -> None:
        """Put GDAL's previous size back, unless something else changed it since; nothing when GDAL never loaded."""
        if _cancel(self._set) or self.previous is None:
            return
        import rasterio.env

        if int(rasterio.env.get_gdal_config("GDAL_CACHEMAX")) == self.nbytes:
            rasterio.env.set_gdal_config("GDAL_CACHEMAX", self.previous)
        self.previous = None
