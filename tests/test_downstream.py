"""The fake downstream: idempotency, fencing, faults, receipts and its durable ledger.

One real server process serves the module; every test uses its own run id. Tests that restart or
stop a server start their own.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # the repository root, for running the tests from a checkout
    sys.path.insert(0, _ROOT)

from killpoint.harness.downstream import Answer, DownstreamClient, LostResponse, start  # noqa: E402
from killpoint.harness.intent import intent_hash  # noqa: E402

META = {"instance": "order-42", "step": "charge", "worker": "A", "attempt": 1,
        "direction": "forward"}
KEY = "order-42:charge:payment-v1"


@pytest.fixture(scope="module")
def downstream(tmp_path_factory):
    ds = start(str(tmp_path_factory.mktemp("downstream") / "ledger.sqlite"))
    yield ds
    ds.stop()


@pytest.fixture
def client(downstream):
    with DownstreamClient(downstream.url, f"run-{uuid.uuid4().hex[:8]}") as c:
        yield c


def _pay(client: DownstreamClient, key: str | None = KEY, amount: int = 100, **kw) -> Answer:
    return client.call("payment", key=key, params={"amount": amount, "currency": "EUR"},
                       meta=META, **kw)


def _outcomes(client: DownstreamClient) -> list[str]:
    return [row["outcome"] for row in client.ledger()]


def _effects(client: DownstreamClient) -> int:
    return sum(1 for row in client.ledger() if row["applied"])


def test_new_key_applies_exactly_one_effect(client):
    a = _pay(client)
    assert a.status == 200 and not a.replay
    assert a.body["status"] == "applied" and a.body["key"] == KEY
    assert a.body["intent_hash"] == intent_hash({"amount": 100, "currency": "EUR"})
    [row] = client.ledger()
    assert row["outcome"] == "applied" and row["applied"] and row["key"] == KEY
    assert row["meta"] == META and row["params"] == {"amount": 100, "currency": "EUR"}


def test_same_key_same_intent_replays_stored_answer_without_new_effect(client):
    first = _pay(client)
    again = _pay(client)
    assert again.status == 200 and again.replay
    assert again.body["effect_id"] == first.body["effect_id"]
    assert {k: v for k, v in again.body.items() if k != "replay"} == \
        {k: v for k, v in first.body.items() if k != "replay"}
    assert _outcomes(client) == ["applied", "replay"]
    assert _effects(client) == 1


def test_same_key_other_intent_is_422_and_never_the_old_result(client):
    _pay(client, amount=100)
    other = _pay(client, amount=999)
    assert other.status == 422 and other.body == {"error": "intent_conflict"}
    assert not other.replay and "effect_id" not in other.body
    rows = client.ledger()
    assert [r["outcome"] for r in rows] == ["applied", "conflict"]
    assert rows[1]["intent_hash"] != rows[0]["intent_hash"] and not rows[1]["applied"]


def test_ignore_intent_mutant_replays_old_result_for_other_intent(client):
    client.configure({"ignore_intent": True})
    first = _pay(client, amount=100)
    other = _pay(client, amount=999)
    assert other.status == 200 and other.replay
    assert other.body["effect_id"] == first.body["effect_id"]
    assert _effects(client) == 1


def test_second_request_while_key_in_flight_gets_409(client, downstream):
    client.configure({"faults": [{"key": KEY, "action": "latency:300"}]})
    answers: list[Answer] = []

    def slow() -> None:
        with DownstreamClient(downstream.url, client.run) as other:
            answers.append(_pay(other))

    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.05)
    answers.append(_pay(client))
    t.join()
    # Whichever request came first sleeps with the key in flight; the other gets 409.
    assert sorted(a.status for a in answers) == [200, 409]
    assert [a.body for a in answers if a.status == 409] == [{"error": "in_flight"}]
    assert sorted(_outcomes(client)) == ["applied", "in_flight"]
    assert _effects(client) == 1
    assert _pay(client).replay  # finished now: a plain replay


def test_keyed_resource_without_key_is_400_and_no_effect(client):
    a = _pay(client, key=None)
    assert a.status == 400 and a.body == {"error": "missing_key"}
    assert _outcomes(client) == ["missing_key"] and _effects(client) == 0


def test_stale_fence_is_409_without_effect_and_equal_fence_passes(client):
    assert _pay(client, key="k1", fence=5).status == 200
    stale = _pay(client, key="k1", fence=4)
    assert stale.status == 409 and stale.body["error"] == "stale_fence"
    assert _pay(client, key="k1", fence=5).replay  # equal passes (and replays)
    assert _pay(client, key="k2", fence=3, fence_scope="shared").status == 200
    assert _pay(client, key="k3", fence=7, fence_scope="shared").status == 200
    assert _pay(client, key="k4", fence=3, fence_scope="shared").status == 409
    rows = client.ledger()
    assert [r["outcome"] for r in rows] == ["applied", "stale_fence", "replay", "applied",
                                            "applied", "stale_fence"]
    assert [r["fence"] for r in rows] == [5, 4, 5, 3, 7, 3]
    assert rows[1]["scope"] == "k1" and rows[5]["scope"] == "shared"
    assert client.receipt("k4") is None


def test_fence_is_ignored_on_a_resource_without_fencing(client):
    client.configure({"resources": {"payment": {"fencing": False}}})
    assert _pay(client, key="k1", fence=5).status == 200
    assert _pay(client, key="k2", fence=1, fence_scope="k1").status == 200


def test_receipt_is_200_for_a_finished_key_and_404_otherwise(client):
    a = _pay(client)
    r = client.receipt(KEY)
    assert r == {"key": KEY, "intent_hash": a.body["intent_hash"], "status": 200,
                 "response": a.body}
    assert client.receipt("never:seen:key-v1") is None


def test_legacy_resource_applies_every_time_without_key_or_receipt(client):
    client.configure({"resources": {"payment": {"legacy": True, "fencing": False}}})
    answers = [_pay(client, key=None) for _ in range(3)]
    assert [a.status for a in answers] == [200, 200, 200]
    assert len({a.body["effect_id"] for a in answers}) == 3
    rows = client.ledger()
    assert [(r["key"], r["outcome"], r["applied"]) for r in rows] == [(None, "applied", True)] * 3
    assert rows[0]["scope"] == "order-42:charge"
    _pay(client, key=KEY)  # a key sent to a legacy resource is ignored
    assert client.ledger()[-1]["key"] is None and client.receipt(KEY) is None
    assert _effects(client) == 4


def test_injected_503_has_no_effect_and_a_retry_applies(client):
    client.configure({"faults": [{"key": KEY, "action": "status:503", "times": 1}]})
    assert _pay(client).status == 503
    assert client.receipt(KEY) is None
    retry = _pay(client)
    assert retry.status == 200 and not retry.replay
    rows = client.ledger()
    assert [(r["status"], r["outcome"], r["applied"]) for r in rows] == \
        [(503, "error", False), (200, "applied", True)]


def test_faults_match_by_instance_and_step_and_are_consumed_in_order(client):
    client.configure({"faults": [
        {"instance": "order-42", "step": "refund", "action": "status:500", "times": 5},
        {"instance": "order-42", "step": "charge", "action": "status:503", "times": 2},
        {"key": None, "instance": None, "step": None, "action": "status:502", "times": 1}]})
    statuses = [_pay(client, key=f"k{i}").status for i in range(5)]
    assert statuses == [503, 503, 502, 200, 200]


def test_dropped_response_is_applied_and_client_raises_lost_response(client):
    client.configure({"faults": [{"key": KEY, "action": "drop"}]})
    with pytest.raises(LostResponse):
        _pay(client)
    [row] = client.ledger()  # the same client reconnects by itself
    assert row["outcome"] == "dropped" and row["applied"] and row["status"] == 200
    receipt = client.receipt(KEY)
    assert receipt is not None and receipt["response"]["status"] == "applied"
    again = _pay(client)
    assert again.replay and again.body["effect_id"] == receipt["response"]["effect_id"]
    assert _effects(client) == 1


def test_before_read_runs_after_the_effect_is_applied(client, downstream):
    seen: list[list[dict]] = []

    def before_read() -> None:
        with DownstreamClient(downstream.url, client.run) as spy:
            seen.append(spy.ledger())

    a = _pay(client, before_read=before_read)
    assert a.status == 200
    [[row]] = seen
    assert row["outcome"] == "applied" and row["applied"]


def test_declined_card_is_402_stored_and_replayed_as_402(client):
    params = {"amount": 100, "card": "declined"}
    first = client.call("payment", key=KEY, params=params, meta=META)
    assert first.status == 402 and first.body["status"] == "declined"
    again = client.call("payment", key=KEY, params=params, meta=META)
    assert again.status == 402 and again.replay
    assert client.receipt(KEY)["status"] == 402
    assert [(r["outcome"], r["applied"]) for r in client.ledger()] == \
        [("declined", False), ("replay", False)]


def test_every_request_is_exactly_one_ledger_row_in_seq_order(client):
    client.configure({"faults": [{"key": "k503", "action": "status:503"}]})
    _pay(client)                      # applied
    _pay(client)                      # replay
    _pay(client, amount=1)            # conflict
    _pay(client, key=None)            # missing_key
    _pay(client, key="k503")          # error
    _pay(client, key="kf", fence=9)
    _pay(client, key="kf2", fence=8, fence_scope="kf")  # stale_fence
    rows = client.ledger()
    assert [r["seq"] for r in rows] == list(range(1, 8))
    assert [r["outcome"] for r in rows] == ["applied", "replay", "conflict", "missing_key",
                                            "error", "applied", "stale_fence"]
    assert all(rows[i]["t"] < rows[i + 1]["t"] for i in range(len(rows) - 1))
    assert set(rows[0]) == {"t", "seq", "resource", "key", "scope", "fence", "intent_hash",
                            "params", "meta", "status", "outcome", "applied"}


def test_runs_are_isolated(client, downstream):
    _pay(client)
    with DownstreamClient(downstream.url, client.run + "-other") as other:
        assert other.receipt(KEY) is None and other.ledger() == []
        assert not _pay(other).replay


def test_keys_receipts_fences_and_config_survive_a_restart(tmp_path):
    with start(str(tmp_path / "ledger.sqlite")) as ds:
        c = DownstreamClient(ds.url, "r1")
        c.configure({"resources": {"legacy-mail": {"legacy": True}}})
        first = _pay(c, fence=3)
        old_pid = ds.pid
        ds.restart()
        assert ds.pid != old_pid
        c = DownstreamClient(ds.url, "r1")
        again = _pay(c, fence=3)
        assert again.replay and again.body["effect_id"] == first.body["effect_id"]
        assert _pay(c, key="other", fence=2, fence_scope=KEY).status == 409
        assert c.call("legacy-mail", key=None, params={}, meta=META).status == 200
        assert c.receipt(KEY)["response"]["effect_id"] == first.body["effect_id"]
        assert [r["seq"] for r in c.ledger()] == [1, 2, 3, 4]
        assert _outcomes(c) == ["applied", "replay", "stale_fence", "applied"]


def test_key_in_flight_when_the_server_died_is_not_wedged_after_restart(tmp_path):
    with start(str(tmp_path / "ledger.sqlite")) as ds:
        # The probe (another step, same key) gets 503s until the slow request holds the key.
        DownstreamClient(ds.url, "r1").configure({"faults": [
            {"instance": "order-42", "step": "charge", "action": "latency:5000"},
            {"instance": "order-42", "step": "probe", "action": "status:503", "times": 1000}]})
        lost: list[BaseException] = []

        def slow() -> None:
            try:
                _pay(DownstreamClient(ds.url, "r1"))
            except LostResponse as e:
                lost.append(e)

        t = threading.Thread(target=slow)
        t.start()
        probe = DownstreamClient(ds.url, "r1")
        for _ in range(200):
            answer = probe.call("payment", key=KEY, params={"amount": 100, "currency": "EUR"},
                                meta={**META, "step": "probe"})
            if answer.status == 409:
                break
            time.sleep(0.005)
        else:
            pytest.fail("the key never went in flight")
        ds.restart()
        t.join()
        assert len(lost) == 1
        c = DownstreamClient(ds.url, "r1")
        a = _pay(c)  # the fault was consumed before the crash
        assert a.status == 200 and not a.replay
        assert _effects(c) == 1


def test_stop_kills_and_reaps_the_server_process(tmp_path):
    ds = start(str(tmp_path / "ledger.sqlite"))
    pid = ds.pid
    os.kill(pid, 0)  # alive
    c = DownstreamClient(ds.url, "r1", timeout=1.0)
    assert c.ledger() == []  # an open keep-alive connection
    ds.stop()
    with pytest.raises(ProcessLookupError):  # killed and reaped: no zombie left
        os.kill(pid, 0)
    ds.stop()  # idempotent
    with pytest.raises(LostResponse):  # a clear error, not a hang
        _pay(c)


def test_a_server_that_cannot_start_is_an_infrastructure_error_naming_why_and_leaves_no_process(tmp_path,
                                                                                                  children):
    # Its ledger in a folder that does not exist: the forked server says why on its pipe and ends;
    # the harness names it and has reaped it.
    from killpoint.errors import InfrastructureError

    before = children()
    with pytest.raises(InfrastructureError, match=r"downstream failed to start: OperationalError"):
        start(str(tmp_path / "no-such-folder" / "ledger.sqlite"))
    assert children() == before


# -- a plain HTTP client, as a user's own worker calls it -------------------------------------------
def _plain_post(url: str, body: dict, headers: dict) -> tuple[int, dict, dict]:
    import json
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


def test_a_plain_http_client_with_the_documented_headers_is_recorded_as_that_step(downstream):
    run = f"run-{uuid.uuid4().hex[:8]}"
    base = f"{downstream.url}/runs/{run}"  # what ctx.downstream_url is
    headers = {"Idempotency-Key": "job-1:charge", "Fencing-Token": "3", "Fencing-Scope": "job-1",
               "Killpoint-Instance": "job-1", "Killpoint-Step": "charge", "Killpoint-Worker": "B",
               "Killpoint-Attempt": "2"}
    status, body, _ = _plain_post(f"{base}/resources/payment", {"params": {"amount": 5}}, headers)
    assert status == 200 and body["status"] == "applied"
    status, body, answer_headers = _plain_post(f"{base}/resources/payment", {"params": {"amount": 5}}, headers)
    assert status == 200 and body["replay"] is True and answer_headers.get("Idempotent-Replayed") == "true"
    stale = {**headers, "Fencing-Token": "2"}
    assert _plain_post(f"{base}/resources/payment", {"params": {"amount": 5}}, stale)[0] == 409
    with DownstreamClient(downstream.url, run) as c:
        rows = c.ledger()
    assert [r["outcome"] for r in rows] == ["applied", "replay", "stale_fence"]
    assert rows[0]["meta"] == {"instance": "job-1", "step": "charge", "worker": "B", "attempt": 2}
    assert rows[0]["scope"] == "job-1" and rows[0]["fence"] == 3


def test_a_bad_attempt_header_is_a_400_naming_it(downstream):
    base = f"{downstream.url}/runs/run-{uuid.uuid4().hex[:8]}"
    status, body, _ = _plain_post(f"{base}/resources/payment", {"params": {}},
                                  {"Idempotency-Key": "k", "Killpoint-Attempt": "two"})
    assert status == 400 and "Killpoint-Attempt" in body["detail"]


def test_one_client_shared_by_threads_gives_each_its_own_connection(client):
    results: list[int] = []
    errors: list[BaseException] = []

    def pay(n: int) -> None:
        try:
            for i in range(5):
                results.append(_pay(client, key=f"thread-{n}-{i}").status)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=pay, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and results == [200] * 40
    assert _effects(client) == 40


def test_a_request_without_the_sessions_secret_gets_403_and_writes_no_ledger_row(downstream, client):
    # Any local process can reach the port; only the harness and the workers it handed the URL to
    # know the secret that is its first path segment. Without it: 403, nothing applied, no row.
    import http.client
    import json
    from urllib.parse import urlsplit

    _pay(client)  # the run exists and has one row
    parts = urlsplit(downstream.url)
    secret = parts.path.strip("/")
    assert len(secret) >= 24 and secret not in ("runs", "health")
    body = json.dumps({"params": {"amount": 1}, "meta": META}).encode()
    attempts = [("POST", f"/runs/{client.run}/resources/payment", body),
                ("POST", f"/wrong-{secret}/runs/{client.run}/resources/payment", body),
                ("POST", f"/{secret[:-1]}/runs/{client.run}/resources/payment", body),
                ("GET", f"/runs/{client.run}/ledger", None),
                ("PUT", f"/runs/{client.run}/config", b"{}"),
                ("GET", "/health", None)]
    for method, path, data in attempts:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request(method, path, body=data, headers={"Idempotency-Key": "intruder-1",
                                                        "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 403, (method, path, resp.status)
        assert json.loads(resp.read())["error"] == "forbidden"
        conn.close()
    rows = client.ledger()
    assert len(rows) == 1 and all(r["key"] == KEY for r in rows)


def test_run_ids_carry_a_random_tail_so_no_other_process_can_guess_them():
    from killpoint.harness.run import RunConfig, Session

    with Session() as session:
        url = session.downstream.url
        a, b = (session.run(RunConfig(workload="single", workers=1)) for _ in range(2))
    assert a.run_id.startswith("run0001-s0-") and b.run_id.startswith("run0002-s0-")
    assert len(a.run_id.rsplit("-", 1)[1]) == 8 and a.run_id.rsplit("-", 1)[1] != b.run_id.rsplit("-", 1)[1]
    assert a.valid is True and url.rsplit("/", 1)[1] not in a.run_id


def test_the_client_reads_an_answer_that_spans_many_reads_and_a_closed_connection_is_reopened(
        client, downstream):
    """Protects killpoint's own HTTP client (written by hand, no http.client): an answer far larger
    than one read (a ledger of half a megabyte) arrives whole, the keep-alive connection serves the
    next request, and after the server closes it (a 403 says Connection: close) the next request
    opens another instead of being lost."""
    big = "x" * 200_000
    for n in range(3):
        client.call("payment", key=f"big-{n}", params={"amount": 1, "note": big}, meta=META)
    rows = client.ledger()
    assert [r["key"] for r in rows] == ["big-0", "big-1", "big-2"]
    assert all(r["params"]["note"] == big for r in rows)
    # The server closes a connection that did not carry the secret: the client's next request on a
    # connection it believed open must not be lost.
    stranger = DownstreamClient(downstream.url.rsplit("/", 1)[0] + "/not-the-secret", client.run)
    status, body, headers = stranger._request("GET", "/ledger")
    assert status == 403 and headers.get("connection") == "close"
    status, body, _ = stranger._request("GET", "/ledger")
    assert status == 403  # answered again, on a new connection
    stranger.close()
    assert len(client.ledger()) == 3


def _raw(downstream, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and read until the server closes it."""
    import socket

    host, port = downstream.address.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def test_the_server_reads_headers_in_any_case_the_first_of_a_repeated_one_and_refuses_a_bad_request(downstream):
    """The server reads a request's headers itself (not through the email package): names in any
    case, the first of a repeated header, ``Connection: close`` and HTTP/1.0 ending the connection
    after the answer, and a request line or header line it cannot read answered 400."""
    secret_path = downstream.url.split(downstream.address, 1)[1]
    run = f"run-{uuid.uuid4().hex[:8]}"
    body = json.dumps({"params": {"amount": 5}}).encode()
    request = (f"POST {secret_path}/runs/{run}/resources/payment HTTP/1.1\r\nhost: x\r\n"
               f"IDEMPOTENCY-KEY: first\r\nidempotency-key: second\r\ncontent-length: {len(body)}\r\n"
               f"connection: close\r\n\r\n").encode() + body
    answer = _raw(downstream, request)
    assert answer.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in answer
    with DownstreamClient(downstream.url, run) as c:
        assert [r["key"] for r in c.ledger()] == ["first"]
    old = _raw(downstream, f"GET {secret_path}/health HTTP/1.0\r\n\r\n".encode())  # closed after it
    assert old.startswith(b"HTTP/1.1 200 ")
    assert _raw(downstream, b"GET /x HTTP/2.0\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert _raw(downstream, b"GET /x HTTP/1.1\r\nno colon here\r\n\r\n").startswith(b"HTTP/1.1 400 ")


def test_a_connection_after_another_closed_is_served_by_the_same_thread(tmp_path):
    """A server thread whose connection closed waits for the next connection instead of ending (a
    new thread a connection cost the server about 0.45 ms of CPU, and every worker opens one);
    connections open at the same time are still served side by side."""
    server = start(str(tmp_path / "ledger.sqlite"))
    try:
        def threads() -> dict[int, str]:
            found = {}
            for tid in os.listdir(f"/proc/{server.pid}/task"):
                try:
                    with open(f"/proc/{server.pid}/task/{tid}/wchan") as fh:
                        found[int(tid)] = fh.read()
                except OSError:
                    continue
            return {tid: wchan for tid, wchan in found.items() if tid != server.pid}

        def settled() -> bool:  # no thread is still on a connection (parked, or ended)
            return all("futex" in wchan for wchan in threads().values())

        serving: set[int] = set()
        for _ in range(5):
            with DownstreamClient(server.url, "one-after-another") as c:
                assert c.receipt("k") is None
                serving |= set(threads())
            deadline = time.monotonic() + 10
            while not settled():
                assert time.monotonic() < deadline, f"a server thread stayed on a closed connection: {threads()}"
                time.sleep(0.005)
        assert len(serving) == 1, f"each connection had a thread of its own: {sorted(serving)}"
        with DownstreamClient(server.url, "a") as a, DownstreamClient(server.url, "b") as b:
            assert a.receipt("k") is None and b.receipt("k") is None  # both held open at once
            assert a.receipt("k") is None
            assert len(threads()) == 2
    finally:
        server.stop()
