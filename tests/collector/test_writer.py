"""The single writer: span batches and write functions share one thread and one connection."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

from collector.decode import PROTOBUF, decode_payload
from collector.store import open_store
from collector.writer import IngestQueue, QueueFullError, ShuttingDownError, SpanWriter
from tests.otlp_builders import make_request


@pytest.fixture
def writer(tmp_path):
    conn = open_store(tmp_path / "w.duckdb")
    writer = SpanWriter(conn.cursor(), IngestQueue(64 * 1024 * 1024))
    writer.start()
    yield writer
    writer.stop()
    conn.close()


def _batch(n: int):
    body = make_request([{"name": f"s{i}"} for i in range(n)]).SerializeToString()
    return decode_payload(body, PROTOBUF)


def test_write_functions_run_on_the_writer_thread_and_commit(writer):
    seen = {}

    def create(conn: duckdb.DuckDBPyConnection) -> int:
        seen["thread"] = threading.current_thread().name
        conn.execute("CREATE TABLE notes (x INTEGER)")
        conn.execute("INSERT INTO notes VALUES (1), (2)")
        return 2

    assert writer.execute_write_fn(create, timeout=10) == 2
    assert seen["thread"] == "driftscope-writer"
    assert writer.execute_write_fn(lambda c: c.execute("SELECT sum(x) FROM notes").fetchone()[0]) == 3
    assert writer.writes == 2


def test_a_failing_write_is_rolled_back_raised_to_its_caller_and_the_writer_goes_on(writer):
    writer.execute_write_fn(lambda c: c.execute("CREATE TABLE notes (x INTEGER)"))

    def half_done(conn):
        conn.execute("INSERT INTO notes VALUES (7)")
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        writer.execute_write_fn(half_done, timeout=10)
    assert writer.failed_writes == 1
    assert writer.execute_write_fn(lambda c: c.execute("SELECT count(*) FROM notes").fetchone()[0]) == 0
    future = writer.queue.submit(_batch(3))
    assert future.result(10) == 3  # spans still commit after a failed write
    assert writer.healthy


def test_span_batches_and_writes_interleave_without_losing_either(writer):
    writer.execute_write_fn(lambda c: c.execute("CREATE TABLE ticks (i INTEGER)"))
    futures = []
    errors = []

    def tick(i):
        try:
            writer.execute_write_fn(lambda c: c.execute("INSERT INTO ticks VALUES (?)", [i]), timeout=30)
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=tick, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for _ in range(20):
        futures.append(writer.queue.submit(_batch(5)))
    for t in threads:
        t.join(30)
    assert not errors
    assert sum(f.result(30) for f in futures) == 100
    counts = writer.execute_write_fn(
        lambda c: c.execute("SELECT (SELECT count(*) FROM ticks), (SELECT count(*) FROM spans)").fetchone()
    )
    assert counts == (20, 100)


def test_the_share_of_recent_time_spent_committing_spans_counts_span_commits_only(writer):
    """span_commit_share: the seconds of the span commits that ended within the window, over the
    window; the writer's other writes (the materializer's) are not ingest and do not count."""
    writer.execute_write_fn(lambda c: c.execute("SELECT 1"))  # a write: not a span commit
    assert writer.span_commit_share(60.0) == 0.0
    for _ in range(3):
        assert writer.queue.submit(_batch(50)).result(10) == 50
    assert writer.span_commit_seconds > 0
    # every span commit so far ended within the last minute, none within the next instant's past
    assert writer.span_commit_share(60.0) == pytest.approx(writer.span_commit_seconds / 60.0)
    time.sleep(0.05)
    assert writer.span_commit_share(0.01) == 0.0


def test_writes_after_stop_are_refused_and_queued_ones_drain(tmp_path):
    conn = open_store(tmp_path / "w.duckdb")
    writer = SpanWriter(conn.cursor(), IngestQueue(1024 * 1024))
    queued = writer.queue.submit_write(lambda c: c.execute("CREATE TABLE late (x INTEGER)"))
    writer.start()
    writer.stop()
    queued.result(10)  # queued before the stop: it ran
    with pytest.raises(ShuttingDownError):
        writer.execute_write_fn(lambda c: None)
    assert conn.execute("SELECT count(*) FROM late").fetchone()[0] == 0
    conn.close()


def test_the_writer_thread_cannot_wait_on_itself(writer):
    result = writer.execute_write_fn(lambda c: _nested(writer), timeout=10)
    assert isinstance(result, RuntimeError)


def _nested(writer):
    try:
        writer.execute_write_fn(lambda c: None)
    except RuntimeError as exc:
        return exc
    return None


def test_take_waits_a_bounded_time_for_the_requests_the_last_commit_answered():
    queue = IngestQueue(64 * 1024 * 1024)
    queue.submit(_batch(2))  # queued before the call: taken, not waited for
    later = threading.Timer(0.05, lambda: queue.submit(_batch(3)))
    later.start()
    taken = queue.take(max_rows=1_000, timeout=1.0, expect=1, linger=5.0)
    later.join()
    assert [batch.accepted for batch, _, _ in taken] == [2, 3]

    queue.submit(_batch(4))
    started = time.monotonic()
    taken = queue.take(max_rows=1_000, timeout=1.0, expect=1, linger=0.1)  # nobody comes back
    assert [batch.accepted for batch, _, _ in taken] == [4]
    assert 0.1 <= time.monotonic() - started < 2.0

    later = threading.Timer(0.05, lambda: queue.submit(_batch(5)))
    later.start()
    taken = queue.take(max_rows=1_000, timeout=1.0, expect=1, linger=5.0)  # the expected one
    later.join()
    assert [batch.accepted for batch, _, _ in taken] == [5]  # ... is not waited for twice


def test_requests_arriving_while_take_lingers_are_held_to_the_byte_limit():
    """What a lingering take() holds is still queued: the queue's byte bound (one oversized
    request at most once nothing is queued) holds while it waits for more."""
    first = _batch(2)
    queue = IngestQueue(max(first.payload_bytes, 1) + 10)  # room for one request
    queue.submit(first)
    outcomes: list[str] = []

    def arrive() -> None:
        for _ in range(3):
            try:
                queue.submit(_batch(2))
                outcomes.append("queued")
            except QueueFullError:
                outcomes.append("refused")
            time.sleep(0.02)

    later = threading.Timer(0.05, arrive)
    later.start()
    taken = queue.take(max_rows=1_000, timeout=1.0, expect=3, linger=0.5)
    later.join()
    assert outcomes == ["refused"] * 3, outcomes  # admitted past the bound before the fix
    assert queue.queued_bytes == sum(size for _, _, size in taken) <= queue.max_bytes


def test_a_busy_writer_gathers_the_requests_of_a_few_connections_into_one_commit(tmp_path):
    conn = open_store(tmp_path / "w.duckdb")
    queue = IngestQueue(64 * 1024 * 1024)
    writer = SpanWriter(conn.cursor(), queue)
    writer.LINGER_SHARE, writer.LINGER_MAX_S = 100.0, 5.0  # wait for whoever was answered
    writer.start()
    try:
        # four clients, each sending its next request once the last is answered
        def client() -> None:
            for _ in range(5):
                queue.submit(_batch(2)).result(10)
                time.sleep(0.02)

        threads = [threading.Thread(target=client) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        writer.stop()
    assert writer.committed_spans == 40
    # 5 rounds of 4 requests: ~6 commits; without gathering each commit takes whatever is
    # queued (10-11 commits of 1-2 requests)
    assert writer.commits <= 8
    conn.close()


def test_commits_that_checkpoint_are_counted_apart(tmp_path):
    """A COMMIT that takes the WAL past the threshold checkpoints inside it: health's split of
    the writer's time (commits, and of them the checkpoints) counts it; small ones do not."""
    conn = open_store(tmp_path / "c.duckdb")
    writer = SpanWriter(conn.cursor(), IngestQueue(64 * 1024 * 1024))
    writer.start()
    try:
        writer.execute_write_fn(lambda c: c.execute("CREATE TABLE notes (x VARCHAR)"))
        writer.execute_write_fn(lambda c: c.execute("INSERT INTO notes VALUES ('a')"))
        assert writer.commit_seconds > 0
        assert writer.auto_checkpoints == 0  # far under the threshold
        writer.execute_write_fn(lambda c: c.execute("SET checkpoint_threshold = '1MB'"))
        for _ in range(4):  # 0.7 MB of WAL each: the second and the fourth checkpoint
            writer.execute_write_fn(
                lambda c: c.execute("INSERT INTO notes SELECT md5(range::VARCHAR) FROM range(20000)")
            )
        assert writer.auto_checkpoints == 2
        assert 0 < writer.auto_checkpoint_seconds <= writer.commit_seconds <= writer.busy_seconds
    finally:
        writer.stop()
        conn.close()
