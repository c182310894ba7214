"""The cluster layer against real processes: a LocalCluster, and a `dask scheduler` + 2 `dask worker` subprocesses.

Functions sent to workers are defined inside the tests (closures/lambdas), so cloudpickle ships them by value and
the `dask worker` processes need not import this test module.
"""

from __future__ import annotations

import io
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import dask
import distributed  # noqa: F401  (imported before any environment snapshot: it sets __DASK_PARENT_PID on import)
import pytest
from dask.utils import parse_bytes as dask_parse_bytes

from rasterflow.cluster import (
    ADDRESS_ENV,
    CLIENT,
    ClusterSettings,
    MemorySampler,
    ProgressReporter,
    gdal_cachemax_env_value,
    open_cluster,
    progress,
    remote_layout,
    resolve_address,
)
from rasterflow.errors import ClusterError
from rasterflow.sizing import WorkerLayout

pytestmark = pytest.mark.slow

DASK = str(Path(sys.executable).with_name("dask"))
LIMIT = 1_500_000_000
GDAL_CACHE = 256_000_000
LAYOUT = WorkerLayout(n_workers=2, threads_per_worker=1, memory_limit=LIMIT, source="local")


def settings(**overrides) -> ClusterSettings:
    values = dict(
        address=None,
        n_workers=2,
        threads_per_worker=1,
        memory_limit="1.5GB",
        gdal_cachemax=GDAL_CACHE,
        memory_target=0.55,
        memory_spill=0.65,
        memory_pause=0.75,
        memory_terminate=0.9,
        connect_timeout=10,
    )
    values.update(overrides)
    return ClusterSettings(**values)


@pytest.fixture(scope="module")
def local():
    """One LocalCluster for the module; the parent's environment is checked while it runs."""
    assert "GDAL_CACHEMAX" not in os.environ, "the test environment must not set GDAL_CACHEMAX itself"
    with open_cluster(settings(), LAYOUT) as handle:
        yield handle


# ---------------------------------------------------------------------------------------------------------------
# LocalCluster
# ---------------------------------------------------------------------------------------------------------------


def test_local_workers_have_the_layout(local):
    assert local.is_local
    assert local.layout == LAYOUT
    workers = local.client.scheduler_info()["workers"]
    assert len(workers) == 2
    assert {w["memory_limit"] for w in workers.values()} == {LIMIT}
    assert {w["nthreads"] for w in workers.values()} == {1}
    assert local.address.startswith("tcp://")
    assert local.as_dict()["n_workers"] == 2


def test_gdal_inside_each_worker_sees_gdal_cachemax(local):
    def gdal_cachemax():
        from rasterio._env import get_gdal_config

        return get_gdal_config("GDAL_CACHEMAX")  # GDAL's own cache-max, in bytes

    seen = local.client.run(gdal_cachemax)
    assert len(seen) == 2
    assert set(seen.values()) == {GDAL_CACHE}
    assert "GDAL_CACHEMAX" not in os.environ  # not leaked into the parent while the cluster runs


def test_gdal_cachemax_env_value_is_exact_bytes():
    assert gdal_cachemax_env_value(256_000_000) == "256000000"
    assert gdal_cachemax_env_value(268_435_456) == "268435456"
    assert gdal_cachemax_env_value(0) == "0"
    assert gdal_cachemax_env_value(50_000) == "1"  # below GDAL's 100000 cut-off a bare number means MiB


def test_memory_thresholds_and_spill_compression_reach_the_workers(local):
    client = local.client
    for key, value in [("target", 0.55), ("spill", 0.65), ("pause", 0.75), ("terminate", 0.9)]:
        got = client.run(lambda key=key: dask.config.get(f"distributed.worker.memory.{key}"))
        assert set(got.values()) == {value}, key
    assert set(client.run(lambda: dask.config.get("distributed.worker.memory.spill-compression")).values()) == {"auto"}

    def resolved_codec():
        import importlib.util

        from distributed.protocol.compression import get_compression_settings

        return importlib.util.find_spec("lz4") is not None, get_compression_settings(
            "distributed.worker.memory.spill-compression"
        )

    assert set(client.run(resolved_codec).values()) == {(True, "lz4")}
    # The nannies too (they enforce `terminate`), and the parent's own config is left as it was.
    assert dask.config.get("distributed.worker.memory.pause") == 0.8


def test_parent_environment_untouched_and_cluster_closed_on_exception():
    before = dict(os.environ)
    one = WorkerLayout(n_workers=1, threads_per_worker=1, memory_limit=LIMIT, source="local")
    with pytest.raises(RuntimeError, match="boom"):
        with open_cluster(settings(n_workers=1), one) as handle:
            address = handle.address
            client = handle.client
            raise RuntimeError("boom")
    assert dict(os.environ) == before  # no GDAL_CACHEMAX, and pre-spawn-environ (OMP_NUM_THREADS...) undone
    assert client.status == "closed"
    with pytest.raises(ClusterError):
        remote_layout(address, timeout=1)  # the LocalCluster's scheduler is gone


# ---------------------------------------------------------------------------------------------------------------
# An existing cluster: real `dask scheduler` and `dask worker` processes
# ---------------------------------------------------------------------------------------------------------------


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def remote(tmp_path_factory):
    """A scheduler and two workers (1.2GB, 2 threads each) as subprocesses; yields the scheduler address."""
    tmp = tmp_path_factory.mktemp("remote-cluster")
    scheduler_file = tmp / "scheduler.json"
    log = open(tmp / "cluster.log", "w")
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(
            [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
             "--scheduler-file", str(scheduler_file)],
            cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
        ))
        _wait_for(lambda: scheduler_file.exists() and scheduler_file.stat().st_size > 0, 30, "the scheduler file")
        import json

        address = json.loads(scheduler_file.read_text())["address"]
        for i in range(2):
            procs.append(subprocess.Popen(
                [DASK, "worker", "--scheduler-file", str(scheduler_file), "--memory-limit", "1.2GB", "--nthreads", "2",
                 "--dashboard-address", ":0", "--local-directory", str(tmp / f"worker-{i}"), "--name", f"w{i}"],
                cwd=tmp, stdout=log, stderr=subprocess.STDOUT,
            ))

        def two_workers():
            try:
                return remote_layout(address, timeout=2).n_workers == 2
            except ClusterError:
                return False

        _wait_for(two_workers, 30, "two workers")
        yield address
    finally:
        for proc in reversed(procs):  # workers first, then the scheduler: each exits in ~0.2 s
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def test_remote_layout_reads_the_real_workers(remote):
    layout = remote_layout(remote)
    assert layout.n_workers == 2
    assert layout.memory_limit == dask_parse_bytes("1.2GB") == 1_200_000_000
    assert layout.threads_per_worker == 2
    assert layout.source == remote


def test_open_cluster_connects_and_leaves_the_remote_cluster_running(remote):
    layout = remote_layout(remote)
    with open_cluster(settings(address=remote), layout) as handle:
        assert not handle.is_local
        assert handle.address == remote
        assert handle.layout == layout
        assert handle.client.submit(lambda x: x + 1, 41).result() == 42
        assert len(handle.client.scheduler_info()["workers"]) == 2
    assert handle.client.status == "closed"
    assert remote_layout(remote).n_workers == 2  # still there


def test_scheduler_address_from_the_environment(remote, monkeypatch):
    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    assert resolve_address(settings()) is None
    monkeypatch.setenv(ADDRESS_ENV, remote)
    assert resolve_address(settings()) == remote
    assert resolve_address(settings(address="tcp://10.0.0.1:8786")) == "tcp://10.0.0.1:8786"  # the spec wins
    with open_cluster(settings(), remote_layout(remote)) as handle:
        assert not handle.is_local and handle.address == remote


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_scheduler_is_a_quick_cluster_error():
    address = f"tcp://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    with pytest.raises(ClusterError) as info:
        remote_layout(address, timeout=2)
    assert time.monotonic() - started < 8
    message = str(info.value)
    assert address in message and "Check" in message
    with pytest.raises(ClusterError, match=re.escape(address)):
        with open_cluster(settings(address=address, connect_timeout=1), LAYOUT):
            pass


# ---------------------------------------------------------------------------------------------------------------
# Memory sampling and progress
# ---------------------------------------------------------------------------------------------------------------


def test_memory_sampler_sees_a_300mb_allocation(local):
    client = local.client
    workers = sorted(client.scheduler_info()["workers"])
    target = workers[0]

    def allocate_and_hold(n, hold):
        import time

        import numpy as np

        array = np.ones(n)  # 40e6 float64 = 320 MB
        time.sleep(hold)
        return float(array.sum())

    with MemorySampler(client, interval=0.1) as sampler:
        time.sleep(0.4)
        sampler.mark("allocate")
        future = client.submit(allocate_and_hold, 40_000_000, 0.6, workers=[target], pure=False)
        assert future.result() == 40_000_000.0
        sampler.mark("done")
        time.sleep(0.2)

    assert [name for _, name in sampler.marks] == ["allocate", "done"]
    seen = {s["worker"] for s in sampler.samples}
    assert set(workers) | {CLIENT} <= seen
    assert all({"t", "worker", "rss", "managed", "spilled"} <= set(s) for s in sampler.samples)
    times = [s["t"] for s in sampler.samples]
    assert times == sorted(times) and times[0] >= 0
    start = sampler.marks[0][0]
    idle = min(s["rss"] for s in sampler.samples if s["worker"] == target and s["t"] < start)
    peaks = sampler.peak_per_worker()
    assert set(peaks) == set(workers)
    assert peaks[target] - idle > 200e6, (idle, peaks)
    assert peaks[workers[1]] - idle < 150e6  # the other worker stayed idle
    assert sampler.client_peak() > 0
    assert sampler.spilled_bytes_total() == 0
    assert len([s for s in sampler.samples if s["worker"] == target]) >= 5

    from rasterflow.report import RunReport

    report = RunReport.start(spec_path="x.yaml").record_memory(sampler)
    assert report.measured_peak_per_worker == peaks
    assert report.memory_samples == sampler.samples  # short runs are not thinned
    assert report.stage_marks == [[t, name] for t, name in sampler.marks]
    assert report.spilled_bytes == 0 and report.client_peak == sampler.client_peak()


def _touch_and_free(nbytes: int) -> None:
    """Allocate ``nbytes`` in this process, touch every page, free it: a spike no periodic RSS sample sees."""
    import numpy as np

    spike = np.ones(nbytes // 8)
    del spike


def test_client_spikes_between_samples_and_after_the_sampler_count(local):
    """The client process's peak carries what happened between two samples (VmHWM, as in the workers) and, through
    the report, what it did after the sampler stopped (the STAC statistics pass runs then)."""
    import psutil

    from rasterflow.cluster import process_peak_since_sample
    from rasterflow.report import RunReport

    sampler = MemorySampler(local.client, interval=10)  # no sample of its own between the ones taken here
    sampler.sample()
    base = psutil.Process().memory_info().rss
    _touch_and_free(300 * 10**6)
    sampler.sample()
    last = [s for s in sampler.samples if s["worker"] == CLIENT][-1]
    assert last["rss"] < base + 100e6  # the spike is gone from the RSS now...
    assert sampler.client_peak() > base + 250e6, (base, last)  # ...but not from the client's peak
    report = RunReport.start(spec_path="x.yaml").record_memory(sampler)
    before = report.client_peak
    assert before is not None
    sampler.sample()  # the sampler's last look: the interval starts again from here
    _touch_and_free(600 * 10**6)  # e.g. the statistics pass, after the cluster is closed
    report.record_process_peak(process_peak_since_sample(reset=False))
    assert report.client_peak is not None and report.client_peak > base + 550e6 > before


def test_progress_prints_plain_lines_when_not_a_tty(local):
    client = local.client

    def slow(i):
        import time

        time.sleep(0.25)
        return i

    futures = [client.submit(slow, i, pure=False) for i in range(6)]
    out = io.StringIO()  # not a TTY, like cron's stdout
    progress(futures, client, interval=0.2, stream=out)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2
    assert all(re.fullmatch(r"\d+/6 tasks done, \d+%, \d+\.\d s", line) for line in lines), lines
    assert lines[-1].startswith("6/6 tasks done, 100%")
    assert "\x1b" not in out.getvalue()  # no terminal escapes
    assert client.gather(futures) == list(range(6))


def test_progress_persists_a_lazy_collection_and_reports_failures(local):
    import dask.array as da

    out = io.StringIO()
    persisted = progress(da.ones((40, 40), chunks=10) * 2, local.client, stream=out, interval=5)
    assert float(persisted.sum().compute()) == 3200.0
    assert out.getvalue().splitlines()[-1].startswith("16/16 tasks done, 100%")

    def fail():
        raise ValueError("nope")

    future = local.client.submit(fail, pure=False)
    out = io.StringIO()
    reporter = ProgressReporter([future], interactive=False, stream=out, interval=5)
    with reporter:
        reporter.wait(10)
    assert reporter.lines[-1].startswith("0/1 tasks done, 0%") and reporter.lines[-1].endswith("1 failed")


def test_progress_bar_on_a_terminal(local):
    futures = [local.client.submit(lambda i: i, i, pure=False) for i in range(3)]
    out = io.StringIO()
    progress(futures, local.client, interactive=True, stream=out)
    assert "3/3" in out.getvalue()


# ---------------------------------------------------------------------------------------------------------------
# Worker health: a worker that cannot hang a run, and cannot outlive it
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the profiler deadlock is a Python <= 3.11 bug")
def test_the_worker_profiler_is_off_on_python_3_11(local):
    # cpython#106883 / dask/distributed#8616: the profiler's sys._current_frames() deadlocked a worker mid-write
    # (seen here: a run that never ended, its worker frozen in trigger_profile -> gc, every other thread on the GIL)
    client = local.client
    assert set(client.run(lambda: dask.config.get("distributed.worker.profile.enabled")).values()) == {False}
    client.submit(sum, range(10**7), pure=False).result()
    assert client.profile().get("count", 0) == 0  # no samples were taken


def test_the_scheduler_steals_work_unless_the_writer_places_chunks_where_their_reads_were_started(local):
    # the writer places a chunk's tasks on the worker whose process started their reads (write.submit); a stolen
    # one reads them again elsewhere (a time-chunked season: 59 of 108 tasks found their reads started)
    def steals(dask_scheduler) -> bool:
        return "stealing" in dask_scheduler.extensions

    assert local.client.run_on_scheduler(steals) is True and local.as_dict()["work_stealing"] is True
    with open_cluster(settings(work_stealing=False), LAYOUT) as handle:
        assert handle.client.run_on_scheduler(steals) is False and handle.as_dict()["work_stealing"] is False
    # the config was put back in this process (where the LocalCluster's scheduler runs) once the scheduler was made
    assert dask.config.get("distributed.scheduler.work-stealing") is True


_HOLD_THE_GIL = """
import os, re, sys
from rasterflow.cluster import ClusterSettings, open_cluster
from rasterflow.sizing import WorkerLayout

def wedge():  # the regex engine does not release the GIL: the worker's Python threads cannot run
    re.match(r"(a+)+$", "a" * 64 + "b")

settings = ClusterSettings(address=None, n_workers=1, threads_per_worker=1, memory_limit="1GB",
                           gdal_cachemax=64_000_000, memory_target=0.6, memory_spill=0.7, memory_pause=0.8,
                           memory_terminate=0.95, connect_timeout=10)
with open_cluster(settings, WorkerLayout(n_workers=1, threads_per_worker=1, memory_limit=10**9,
                                         source="local")) as handle:
    pid = list(handle.client.run(os.getpid).values())[0]
    handle.client.submit(wedge, pure=False)
    print(pid, flush=True)
    import time
    time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_wedged_worker_dies_with_its_killed_run(tmp_path):
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", _HOLD_THE_GIL], stdout=subprocess.PIPE, text=True,
                            cwd=tmp_path, start_new_session=True)
    try:
        assert proc.stdout is not None
        worker = psutil.Process(int(proc.stdout.readline()))
        time.sleep(2)  # the task is running and holds the GIL
        assert worker.is_running()
        proc.kill()  # the run is SIGKILLed: no shutdown, no message to the worker
        proc.wait(timeout=10)
        gone, alive = psutil.wait_procs([worker], timeout=10)
        assert not alive, "the worker outlived its run"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_worker_processes_keep_glibcs_own_allocator_thresholds(local):
    """distributed's MALLOC_TRIM_THRESHOLD_=65536 (like any fixed allocator setting) freezes glibc's mmap threshold,
    so every plane-sized temporary is a fresh mmap (2.4x the task time, benchmarks/README.md "Worker malloc"):
    rasterflow's workers start without it (that the parent's environment is put back, whatever an earlier
    LocalCluster of this test session left in it, is the next test's)."""
    keys = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "OMP_NUM_THREADS")
    seen = local.client.run(lambda: {k: os.environ.get(k) for k in keys})
    assert len(seen) == LAYOUT.n_workers
    for values in seen.values():
        assert values == {"MALLOC_TRIM_THRESHOLD_": None, "MALLOC_MMAP_THRESHOLD_": None, "MALLOC_TOP_PAD_": None,
                          "OMP_NUM_THREADS": "1"}  # distributed's one thread per numerical library stays


def _malloc_arenas() -> int | None:
    """glibc's arenas in this process (``malloc_info``'s ``<heap nr=..>`` entries) after 4 threads each allocated
    and freed blocks below the mmap threshold; None off glibc. Runs on a worker."""
    import ctypes
    import ctypes.util
    import tempfile
    import threading

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_info  # noqa: B018
    except (OSError, AttributeError):
        return None
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    start = threading.Barrier(4)

    def allocate() -> None:
        start.wait()  # all four at once: each needs an arena while the others hold theirs
        blocks = [libc.malloc(64 * 1024) for _ in range(64)]
        for block in blocks:
            libc.free(block)

    threads = [threading.Thread(target=allocate) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        stream = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, stream)
        libc.fclose(stream)
        return len(re.findall(r'<heap nr="\d+">', Path(out.name).read_text()))


def test_worker_processes_have_one_malloc_arena(local):
    """Every thread that allocates gets its own glibc arena, which keeps its fragments: a worker's peak crept ~10%
    above a short job's over its first tasks (benchmarks/README.md, "Worker arenas"). rasterflow's workers start
    with MALLOC_ARENA_MAX=1: however many threads allocate in them, there is one arena; this process (not a worker,
    glibc's default) gets more."""
    seen = local.client.run(_malloc_arenas)
    if None in seen.values():
        pytest.skip("not glibc")
    assert list(seen.values()) == [1] * LAYOUT.n_workers
    assert _malloc_arenas() > 1  # the same threads make arenas where the limit is not set


def test_distributeds_trim_threshold_left_in_this_process_does_not_reach_the_workers(monkeypatch):
    """An earlier LocalCluster's nanny (any in this process) wrote MALLOC_TRIM_THRESHOLD_=65536 into the environment
    and the workers would inherit it: rasterflow's workers start without it and the environment is put back."""
    from rasterflow.cluster import open_cluster

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with open_cluster(settings(processes=True), LAYOUT) as handle:
        seen = handle.client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
        assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "65536"  # this process's own, back once the workers exist
    assert list(seen.values()) == [None, None]


def test_allocator_settings_of_the_users_dask_config_win():
    import dask

    from rasterflow.cluster import worker_environ

    assert "MALLOC_TRIM_THRESHOLD_" in dask.config.get("distributed.nanny.pre-spawn-environ")  # distributed's default
    assert "MALLOC_TRIM_THRESHOLD_" not in worker_environ()
    assert worker_environ()["OMP_NUM_THREADS"] == 1  # distributed's own stay
    assert worker_environ()["MALLOC_ARENA_MAX"] == 1
    with dask.config.set({"distributed.nanny.pre-spawn-environ": {"MALLOC_TRIM_THRESHOLD_": 0, "OMP_NUM_THREADS": 2}}):
        assert worker_environ() == {"MALLOC_TRIM_THRESHOLD_": 0, "OMP_NUM_THREADS": 2}


def test_a_malloc_arena_max_of_the_environment_wins(monkeypatch):
    """The workers inherit the user's MALLOC_ARENA_MAX; rasterflow's own must not override it."""
    from rasterflow.cluster import worker_environ

    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert "MALLOC_ARENA_MAX" not in worker_environ()


def test_the_heap_is_trimmed_on_any_platform():
    from rasterflow.allocator import can_trim, release_free_memory

    release_free_memory()  # no error, on any platform
    import platform

    assert can_trim() == (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
