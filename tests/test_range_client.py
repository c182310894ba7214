"""RangeClient on its own (rasterflow.read.fetch), against the loopback fault server (tests/http_faults.py): the
first try made without tenacity still leaves the retries, their count and the message when it gives up as they
were (no request more or less); a cancelled submission frees its place in flight; the answers of a submission come
in the order of its ranges; submissions from many threads at once (one wake-up of the loop for a burst) all finish
within the bound on requests in flight.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from http_faults import Fault, fault_server

from rasterflow import retry
from rasterflow.read.fetch import RangeClient
from rasterflow.read.policy import collect
from rasterflow.read.remote import ReadFailedError

FAST = retry.RetryPolicy(attempts=4, backoff=0.01, max_delay=0.05, timeout=5)
DATA = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("range-client")
    (path / "blob.bin").write_bytes(DATA)
    return path


@pytest.fixture
def client():
    each = RangeClient(3)
    yield each
    each.close()


def _fetch(client: RangeClient, url: str, ranges, policy=FAST, run_id="rc"):
    tries: list[int] = []
    future = client.submit("href-name", url, ranges, policy, run_id, on_retry=lambda: tries.append(1))
    try:
        return future.result(30), len(tries)
    except ReadFailedError as err:
        return err, len(tries)


@pytest.mark.parametrize("failures", [1, 3])
def test_transient_failures_are_retried_with_one_request_per_try(root, client, failures):
    with fault_server(root, faults=[Fault("status", path="/blob.bin", nth=set(range(1, failures + 1)),
                                          status=503)]) as server:
        answers, retried = _fetch(client, f"{server.url}/blob.bin", [(1000, 5000)])
        assert server.count("/blob.bin") == failures + 1  # the failed first try is not made twice
    assert [a.data for a in answers] == [DATA[1000:6000]] and answers[0].size == len(DATA)
    assert retried == failures
    assert collect("rc")["io"]["requests"] == failures + 1


@pytest.mark.parametrize("status, attempts, tries", [(503, 4, 4), (503, 1, 1), (404, 4, 1)])
def test_a_failure_gives_up_after_the_policys_tries(root, client, status, attempts, tries):
    policy = retry.RetryPolicy(attempts=attempts, backoff=0.01, max_delay=0.05, timeout=5)
    with fault_server(root, faults=[Fault("status", path="/blob.bin", always=True, status=status)]) as server:
        error, retried = _fetch(client, f"{server.url}/blob.bin", [(0, 100)], policy)
        assert server.count("/blob.bin") == tries
    collect("rc")
    assert isinstance(error, ReadFailedError) and error.status == status and error.href == "href-name"
    assert retried == tries - 1 and error.attempts == tries
    assert str(error).startswith(f"HTTP {status}")
    assert (f"gave up after {tries} tries: transient failures; source.retry.attempts is {attempts}" in str(error)) \
        == (tries > 1)
    assert error.transient == (status == 503)


def test_the_answers_come_in_the_order_of_the_ranges_and_one_failure_fails_the_submission(root, client):
    ranges = [(500_000, 70_000), (0, 10), (1_000_000, 48_576), (123, 4567)]
    with fault_server(root) as server:
        answers, _ = _fetch(client, f"{server.url}/blob.bin", ranges)
        assert [a.data for a in answers] == [DATA[s:s + n] for s, n in ranges]
        assert _fetch(client, f"{server.url}/blob.bin", [])[0] == []
    with fault_server(root, faults=[Fault("status", path="/blob.bin", nth={3}, status=404)]) as server:
        error, _ = _fetch(client, f"{server.url}/blob.bin", ranges)
    collect("rc")
    assert isinstance(error, ReadFailedError) and error.status == 404


def test_a_cancelled_submission_frees_its_place_in_flight(root):
    client = RangeClient(1)
    try:
        with fault_server(root, latency=3.0) as server:
            url = f"{server.url}/blob.bin"
            slow = client.submit("h", url, [(0, 100)], FAST, "rc")
            deadline = time.monotonic() + 2
            while server.in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert client._in_flight == 1
            started = time.monotonic()
            assert slow.cancel()
            while client._in_flight and time.monotonic() - started < 2:
                time.sleep(0.01)
            assert client._in_flight == 0 and time.monotonic() - started < 1.5  # not after the server's 3 s
            server.latency = 0.0
            assert client.submit("h", url, [(7, 9)], FAST, "rc").result(10)[0].data == DATA[7:16]
    finally:
        client.close()
    collect("rc")


def test_bursts_of_submissions_from_many_threads_all_finish_within_the_bound(root, client):
    with fault_server(root, latency=0.002) as server:
        url = f"{server.url}/blob.bin"
        results: dict[int, list] = {}
        errors: list[str] = []

        def burst(k: int) -> None:
            try:
                futures = [client.submit("h", url, [(k * 1000 + i * 7, 500)], FAST, "rc") for i in range(60)]
                results[k] = [f.result(60)[0].data for f in futures]
            except Exception as err:  # noqa: BLE001 - reported below, with the thread it failed in
                errors.append(f"thread {k}: {err!r}")

        threads = [threading.Thread(target=burst, args=(k,)) for k in range(4)]
        for each in threads:
            each.start()
        for each in threads:
            each.join(120)
        # aiohttp itself may send a GET again on a reset keep-alive connection: at least one request each
        requests = server.count("/blob.bin")
    assert not errors and requests >= 240
    assert all(results[k] == [DATA[k * 1000 + i * 7:k * 1000 + i * 7 + 500] for i in range(60)] for k in range(4))
    io = collect("rc")["io"]
    assert io["requests"] == 240 and 1 <= io["in_flight_peak"] <= 3  # the client's own count of requests at once


def test_a_closed_client_refuses_new_submissions(root):
    client = RangeClient(2)
    with fault_server(root) as server:
        assert client.submit("h", f"{server.url}/blob.bin", [(0, 4)], FAST, "rc").result(10)[0].data == DATA[:4]
        client.close()
        with pytest.raises(RuntimeError):
            client.submit("h", f"{server.url}/blob.bin", [(0, 4)], FAST, "rc")
    collect("rc")


PIECES = [(0, 700), (900, 50), (5000, 1000)]  # offsets in the range: gaps between them, one at its end


def test_pieces_of_a_range_come_apart_as_the_body_arrives(root, client):
    """A range asked for in pieces (the tiles of one request): each piece's bytes apart, equal to the file's, the
    gaps and the range's tail read and dropped; one request, the whole range counted as received."""
    with fault_server(root, latency=0.01) as server:
        future = client.submit("h", f"{server.url}/blob.bin", [(3000, 6500)], FAST, "rc", pieces=PIECES)
        answer = future.result(30)[0]
        assert server.count("/blob.bin") == 1
    assert answer.data == b"" and answer.size == len(DATA)
    assert answer.parts == tuple(DATA[3000 + offset:3000 + offset + count] for offset, count in PIECES)
    assert collect("rc")["io"]["bytes"] == 6500


@pytest.mark.parametrize("fault", ["truncate", "bad_range"])
def test_a_body_in_pieces_cut_short_or_of_another_range_is_retried(root, client, fault):
    """A body that ends early, or whose Content-Range is not the range asked for, is a transient failure of the
    request even when it is read in pieces: tried again, and the pieces then are the file's."""
    with fault_server(root, faults=[Fault(fault, path="/blob.bin", nth={1})]) as server:
        tries: list[int] = []
        future = client.submit("h", f"{server.url}/blob.bin", [(3000, 6500)], FAST, "rc", pieces=PIECES,
                               on_retry=lambda: tries.append(1))
        answer = future.result(30)[0]
        assert server.count("/blob.bin") == 2
    assert tries == [1]
    assert answer.parts == tuple(DATA[3000 + offset:3000 + offset + count] for offset, count in PIECES)
    collect("rc")


def test_pieces_need_a_submission_of_one_range(client):
    with pytest.raises(ValueError, match="one range"):
        client.submit("h", "http://127.0.0.1:9/x", [(0, 10), (20, 10)], FAST, "rc", pieces=[(0, 5)])
