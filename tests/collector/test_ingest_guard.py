"""In-process properties of the ingest guards (issue 12): gzip read as gzip readers read it, the
decode pool's concurrency bound, the pending-bytes bound."""

import gzip
import json
import threading
import time

import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.decode import DecodeError
from collector.http_receiver import BodyTooLargeError, gunzip_bounded
from collector.ingest_guard import DecodePool, PendingBytes, PendingBytesFullError

quick = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))  # fmt: skip

members = st.lists(st.binary(max_size=300), min_size=1, max_size=5)


@quick
@given(members, st.integers(0, 8), st.sampled_from([0, 1, 9]))
def test_every_gzip_member_is_decoded_and_zero_padding_allowed(chunks, zeros, level):
    body = b"".join(gzip.compress(chunk, compresslevel=level) for chunk in chunks) + b"\x00" * zeros
    assert gunzip_bounded(body, 10_000) == b"".join(chunks)


@quick
@given(members, st.binary(min_size=1, max_size=20).filter(lambda t: t.strip(b"\x00")))
def test_any_other_trailing_bytes_are_a_decode_error(chunks, trailer):
    body = b"".join(gzip.compress(chunk) for chunk in chunks) + trailer
    with pytest.raises(DecodeError, match="gzip"):
        gunzip_bounded(body, 10_000)


@quick
@given(members, st.integers(0, 1500))
def test_the_limit_holds_across_members(chunks, limit):
    body = b"".join(gzip.compress(chunk) for chunk in chunks)
    total = sum(map(len, chunks))
    if total > limit:
        with pytest.raises(BodyTooLargeError):
            gunzip_bounded(body, limit)
    else:
        assert gunzip_bounded(body, limit) == b"".join(chunks)


def test_a_truncated_member_is_a_decode_error():
    body = gzip.compress(b"a" * 100) + gzip.compress(b"b" * 100)[:-4]
    with pytest.raises(DecodeError, match="truncated"):
        gunzip_bounded(body, 10_000)


def test_gzip_bombs_in_several_members_stop_at_the_limit():
    bomb = gzip.compress(b"\x00" * (16 * 1024 * 1024))
    with pytest.raises(BodyTooLargeError, match="1048576-byte limit"):
        gunzip_bounded(bomb * 3, 1024 * 1024)
    small = gzip.compress(b"\x00" * (600 * 1024))
    with pytest.raises(BodyTooLargeError):
        gunzip_bounded(small * 2, 1024 * 1024)  # each member under the limit, together over it


def test_the_decode_pool_runs_at_most_its_workers_at_once():
    pool = DecodePool(2)
    running = []
    peak = []
    lock = threading.Lock()

    def work(_):
        with lock:
            running.append(1)
            peak.append(len(running))
        time.sleep(0.05)
        with lock:
            running.pop()

    threads = [threading.Thread(target=pool.call, args=(work, i)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pool.shutdown()
    assert max(peak) == 2


def test_pending_bytes_refuse_past_the_limit_and_free_on_release():
    pending = PendingBytes(100)
    pending.reserve(60)
    with pytest.raises(PendingBytesFullError, match="max_pending_bytes"):
        pending.reserve(41)
    pending.reserve(40)
    pending.release(60)
    pending.reserve(60)
    assert pending.held == 100 and pending.peak == 100


HOSTILE_VALUES = [
    "[" * 5000,
    '{"a":' * 5000,
    '{"langgraph_node": ' + "[" * 5000,
    '{"args": ' + "[" * 5000 + "]" * 5000 + "}",
    "[" * 900 + "]" * 900,
    "9" * 5000,
    "-1e999",
    "NaN",
    "\x00",
    "",
    "\ud7ff" * 10,
    '{"input_str": "' + "x" * 100 + '", "inputs": ' + "{" * 3000 + "}",
]


@pytest.mark.parametrize("value", HOSTILE_VALUES, ids=range(len(HOSTILE_VALUES)))
def test_a_hostile_value_in_every_convention_key_never_costs_the_good_span(value):
    """Every attribute the convention table reads, on a span and its resource, set to a value
    built to break a parser: the request decodes (no exception), and the good span beside it is
    accepted (the hostile one too, its value kept as text)."""
    from collector import conventions
    from collector.decode import JSON, PROTOBUF, decode_payload, encode_hex_ids
    from tests.otlp_builders import make_request, set_attr

    keys = sorted({source.key for rule in conventions.RULES for source in rule.sources})
    span_keys = [k for k in keys if ":" not in k]
    resource_keys = [k.split(":", 1)[1] for k in keys if k.startswith("resource:")]
    request = make_request([{"name": "good"}, {"name": value[:50], "attrs": dict.fromkeys(span_keys, value)}])
    for key in resource_keys:
        set_attr(request.resource_spans[0].resource.attributes, key, value)
    document = encode_hex_ids(json_format.MessageToDict(request))
    for payload, media in ((request.SerializeToString(), PROTOBUF), (json.dumps(document).encode(), JSON)):
        batch = decode_payload(payload, media)
        assert batch.accepted == 2, (media, batch.errors)


def _gunzip_cpu_seconds(body: bytes) -> float:
    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        assert gunzip_bounded(body, 1024) == b""
        best = min(best, time.process_time() - started)
    return best


def test_gunzip_is_linear_in_the_number_of_members():
    """Issue 32: each member copied the rest of the body (zlib's unused_data), so a body of empty
    20-byte members cost time quadratic in its size (7 CPU-s at 2 MiB)."""
    member = gzip.compress(b"", mtime=0)
    small = member * (256 * 1024 // len(member))
    large = member * (1024 * 1024 // len(member))
    small_s, large_s = _gunzip_cpu_seconds(small), _gunzip_cpu_seconds(large)
    assert large_s < 1.0, f"1 MiB of empty members took {large_s:.2f} CPU-s"
    assert large_s < 8 * max(small_s, 0.005), (small_s, large_s)  # 4x the body: ~4x, not ~16x
