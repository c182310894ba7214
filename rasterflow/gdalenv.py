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

import os
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

__all__ = [
    "REMOTE_READ_DEFAULTS", "VSI_CACHE_SIZE", "CURL_CACHE_SIZE", "remote_read_options", "process_env",
    "aws_endpoint_options", "allowed_extensions", "AWS_ENV_NAMES", "aws_env_summary", "PROCESS_KEYS",
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
