"""Findings tables on a ClickHouse store: ``analytics.materialize``'s design on ClickHouse's operations.

The store's writer logs, around every write of `spans`, the runs and origin tasks it touched
(``change_partitions``, then a ``change_log`` row once the spans are written: the collector's
``clickhouse_changes``). A pass here reads that log in ``seq`` order up to the newest change
below any change still being written, and brings each result of ``maintained()`` up to date with
the same compute functions as on DuckDB (translated by ``analytics.dialect``):

* a result partitioned by ``run_id`` / ``origin_task_id`` recomputes the partitions logged since
  the change its table reflects; one with no partition (its answer depends on every run) is
  recomputed whole, under ingest as often as ``materialize.WholeSchedule`` allows. run_summary
  is one of these here: assembled from the other tables (no span read), whole;
* DuckDB's per-span and per-(run, tool) folds (``analytics.loops_fold``, the comparison's tables)
  are DuckDB and Python: here repeated_calls and runaway_runs are their detectors' full
  computations scoped to the touched runs (and whole), and the comparison keeps no tables.

ClickHouse cannot replace a partition's rows in a transaction, so rows are versioned: every write
inserts the partition's new rows with a new ``_ver`` and then a ``findings_parts`` row naming
that version current for the partition; reads take, per partition, the rows of its newest version
at or above the state's ``base`` (a rebuild, a whole recomputation, moves ``base`` past every
older row). A kill between the rows and the marker leaves rows no read takes; between the marker
and the ``findings_state`` row, a table a little ahead of its state, recomputed again next pass.
Older versions are deleted by ``prune`` (lightweight DELETE: the rows are not read any more).

Reads (``analytics.read_clickhouse``) are SELECTs with DuckDB's read semantics; what the tables
cannot answer (a window, a service or agent filter, a table not built) is None and the caller
computes. Thresholds and goal scores (``inputs``) are part of a table's version: when they
change, the tables are rebuilt (on DuckDB such writes log a change; here they are written by
other processes, e.g. ``driftscope calibrate --store``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pyarrow as pa

import analytics.materialize as materialize
from analytics.findings_clickhouse import (
    NULL_PART,
    PART,
    VERSION,
    ChState,
    RowVersions,
    count_of,
    current_rows,
    current_versions,
    dict_rows,
    qualified,
    read_states,
    table_columns,
    target_change,
    touched_keys,
    write_rows,
    write_state,
)
from analytics.materialize import Maintained, PassReport

logger = logging.getLogger(__name__)

# Past this many touched partitions and this share of all, one unscoped computation (as DuckDB)
MANY_KEYS, MANY_SHARE, CHUNK_KEYS = materialize.MANY_KEYS, materialize.MANY_SHARE, materialize.CHUNK_KEYS
PRUNE_EVERY = 20  # passes that wrote something between two prunes
# How often a materializer with the store's change log looks for partitions whose spans are gone
# (``log_expired``): ClickHouse's TTL drops whole days of `spans` and logs nothing.
EXPIRY_CHECK_S = 300.0


def maintained() -> dict[str, Maintained]:
    """What is kept on ClickHouse: DuckDB's registry (``materialize.maintained``) without the
    per-span and per-(run, tool) folds and the comparison's tables; a result reading those is its
    detector's full computation. run_summary is kept by run as on DuckDB (assembled from the
    other tables): the runs the log names and those whose counts the other tables changed."""
    items = materialize.maintained()
    out: dict[str, Maintained] = {}
    for name, item in items.items():
        if (
            name.startswith("compare_")
            or name == materialize.RUN_ACTORS
            or item.partition in ("span", "run_tool")
        ):
            continue
        if item.depends and item.extra_keys is None and not item.portable:
            # a fold's reader (its compute reads DuckDB's tables): its own computation
            if item.detector is None:
                continue
            item = dataclasses.replace(item, compute=materialize.detector_compute(item.detector), depends=())
        extra_keys = None
        if item.depends and item.extra_keys is not None:
            # run_summary: by run, the runs whose counts other tables changed its extra keys
            item = dataclasses.replace(item, depends=tuple(d for d in item.depends if d in out))
            extra_keys = item.extra_keys
        # ch2: run_summary's table, whole before, is by run (its earlier rows are not read)
        suffix = "|ch2" if extra_keys is not None else "|ch1"
        version = item.version.split("|")[0] + "|" + materialize._settings_version() + suffix
        out[name] = dataclasses.replace(
            item, version=version, extra_keys=extra_keys, touched=None, apply=None, build=None
        )
    read = {first for item in out.values() for first in item.depends}  # a part no result here reads
    return {name: item for name, item in out.items() if name not in materialize.PARTS or name in read}


def inputs(store) -> str:
    """What every table also depends on besides the spans: the thresholds and goal scores stored."""
    row = dict_rows(
        store,
        f"SELECT (SELECT count() FROM {qualified(store, 'thresholds')} FINAL) AS t, "
        f"(SELECT toString(max(created_at)) FROM {qualified(store, 'thresholds')}) AS tm, "
        f"(SELECT count() FROM {qualified(store, 'goal_scores')} FINAL) AS g, "
        f"(SELECT toString(max(created_at)) FROM {qualified(store, 'goal_scores')}) AS gm",
    )[0]
    return f"{row['t']}@{row['tm']},{row['g']}@{row['gm']}"


# ---------------------------------------------------------------------------------------- passes


def bring_up_to_date(
    store,
    names: list[str] | None = None,
    whole_due: Callable[[str], bool] | None = None,
    turn: threading.Lock | None = None,
    versions: RowVersions | None = None,
    between: Callable[[str], None] | None = None,
) -> PassReport:
    """One pass: bring every result (of ``names``, and what they read) up to the newest change a
    pass may take (``target_change``) when its turn comes. ``whole_due(name)``: whether a result
    kept whole may be recomputed now (None: always). ``turn``: held while each result is computed and written (serve
    shares the store's session with its reads). ``between(name)`` is called before each result
    (serve's thread yields to ingest there)."""
    report = PassReport(recomputed={}, failed={})
    report.target = target_change(store)
    states = read_states(store)
    items = maintained()
    fingerprint = inputs(store)
    versions = versions or RowVersions(store)
    if names is not None:
        names = materialize.with_dependencies(items, names)
    # by the change each reflects; each result goes up to the newest change when its turn comes,
    # a result reading others' tables no further than they reflect (as on DuckDB)
    current: dict[str, int] = {}
    totals: dict[str, int] = {}
    for name, item in items.items():
        if names is not None and name not in names:
            continue
        version = f"{item.version}|inputs={fingerprint}"
        state = states.get(name)
        fresh = state is not None and state.version == version and state.seq is not None
        target = target_change(store)
        if fresh and state.seq >= target:
            current[name] = state.seq
            continue
        if any(first not in current for first in item.depends):
            continue
        target = min([target, *(current[first] for first in item.depends)])
        if fresh and state.seq >= target:
            current[name] = state.seq
            continue
        if item.partition is None and fresh and whole_due is not None and not whole_due(name):
            continue
        if between is not None:
            between(name)
        started = time.perf_counter()
        try:
            with turn or nullcontext():
                report.recomputed[name] = _bring_one(
                    store, item, version, state if fresh else None, target, versions, totals
                )
            current[name] = target
        except Exception as exc:  # noqa: BLE001 - one result's failure must not stop the others
            message = f"{type(exc).__name__}: {exc}"
            logger.warning("materializer (ClickHouse): %s not brought up to date: %s", name, message)
            report.failed[name] = message
            if state is not None:
                try:
                    write_state(store, item, state.version, state.seq, state.base, versions.next(),
                                 state.rows, state.failed_keys, message)  # fmt: skip
                except Exception:  # noqa: BLE001 - the store itself is failing: health says so
                    logger.debug("could not record the failure of %s", name, exc_info=True)
        finally:
            report.compute_seconds[name] = time.perf_counter() - started
    return report


def _bring_one(store, item: Maintained, version: str, state: ChState | None, target: int,
               versions: RowVersions, totals: dict[str, int]) -> int:  # fmt: skip
    """Bring ``item`` from ``state`` (None: not built by this version) to ``target``; returns the
    partitions recomputed (-1: whole)."""
    if item.partition is None:
        ver = versions.next()
        rows = write_rows(store, item, item.compute(store, None, None), None, ver)
        write_state(store, item, version, target, ver, versions.next(), rows)
        return -1
    keys = None if state is None else touched_keys(store, item.partition, state.seq, target)
    if keys is not None and item.extra_keys is not None:  # run_summary: runs other tables changed
        keys = list(dict.fromkeys([*keys, *item.extra_keys(store)]))
    if state is None or _unscoped(store, keys, item.partition, totals):
        if state is None:  # another definition's rows: reads compute until the table is rebuilt
            write_state(store, item, version, None, 0, versions.next())
            store.command(f"DROP TABLE IF EXISTS {qualified(store, item.table)} SYNC")
        ver = versions.next()
        rows = write_rows(store, item, item.compute(store, item.partition, None), None, ver)
        write_state(store, item, version, target, ver, versions.next(), rows)
        _record_pruned(store, item.name, ver)  # one version per partition, as after a prune
        return -1 if keys is None else len(keys)
    failed = [key for key in state.failed_keys if key not in set(keys)]
    error = None
    for start in range(0, len(keys), CHUNK_KEYS):
        chunk = keys[start : start + CHUNK_KEYS]
        frame, bad, message = materialize._compute_keys(store, item, chunk)
        failed += bad
        error = message or error
        write_rows(store, item, frame, [key for key in chunk if key not in set(bad)], versions.next())
    write_state(store, item, version, target, state.base, versions.next(), state.rows, failed, error)
    return len(keys)


def _unscoped(store, keys: list[str] | None, partition: str, totals: dict[str, int]) -> bool:
    """Whether ``keys`` are better computed as one unscoped computation (most partitions)."""
    if keys is None or len(keys) <= MANY_KEYS:
        return False
    if partition not in totals:
        totals[partition] = count_of(
            store,
            f"SELECT uniqExact(`{partition}`) AS n FROM {qualified(store, 'spans')} WHERE `{partition}` IS NOT NULL",
        )
    return len(keys) >= MANY_SHARE * totals[partition]


def prune(store) -> int:
    """Delete the rows no read takes any more (older versions, partitions a rebuild left) and
    the change log every table consumed (never the newest entry). Returns the results pruned."""
    states = read_states(store)
    pruned = 0
    for name, item in maintained().items():
        state = states.get(name)
        if state is None or state.seq is None or not table_columns(store, item.table):
            continue
        # the newest version written before the DELETE: every row at or below it that the DELETE
        # leaves is its partition's only one (a version written meanwhile is above it)
        (seen,) = dict_rows(
            store,
            f"SELECT count() AS n, max(ver) AS ver FROM {qualified(store, 'findings_parts')} WHERE metric = '{name}'",
        )
        store.command(
            f"DELETE FROM {qualified(store, item.table)} WHERE (`{PART}`, `{VERSION}`) "
            f"NOT IN ({current_versions(store, name, state.base)}) SETTINGS lightweight_deletes_sync = 2"
        )
        store.command(
            f"DELETE FROM {qualified(store, 'findings_parts')} WHERE metric = '{name}' AND ver < {int(state.base)}"
        )
        if seen["n"]:  # after the DELETE returned (synchronous): reads rely on it
            _record_pruned(store, name, int(seen["ver"]))
        pruned += 1
    seqs = [states[n].seq for n in maintained() if n in states and states[n].seq is not None]
    if seqs and len(seqs) == len(maintained()):
        floor = min(min(seqs), target_change(store) - 1)
        for table in ("change_log", "change_partitions"):
            store.command(f"DELETE FROM {qualified(store, table)} WHERE seq <= {int(floor)}")
    return pruned


def _record_pruned(store, name: str, ver: int) -> None:
    """Record that every row of ``name``'s table at or below version ``ver`` is its partition's
    only version (read_clickhouse sorts out only the partitions written after it): after a prune's
    synchronous DELETE, or after an unscoped write (``ver`` its rows' one version, the state's
    new base). The newest record counts (ReplacingMergeTree by result). The table is init's
    (``collector.clickhouse_schema.findings_ddl``), as ``findings_parts`` is: every process that
    writes the findings tables runs init first."""
    store.insert_arrow("findings_pruned", pa.table({"metric": [name], "ver": pa.array([ver], pa.uint64())}))


def expired_partitions(store) -> list[tuple[str, str]]:
    """The (partition, key) pairs whose findings count spans the store no longer has.

    ClickHouse's TTL drops whole days of `spans` (``--ttl-days``: `spans` is partitioned by day)
    and a DELETE by hand drops rows, without a change-log entry. Taken as gone: the keys the tables
    hold current rows of and no span has any more; the keys with a row first seen before the
    oldest day `spans` still holds (a run or an origin task that went on past midnight keeps its
    later spans: its findings are recomputed from them); and the origin tasks the remaining spans
    of those runs worked on. ``run_summary_base`` holds a row per run with its first span, so
    every run that lost spans to the TTL is found."""
    states = read_states(store)
    spans = qualified(store, "spans")
    oldest = store.execute(
        "SELECT toString(min(toDate(partition))) AS d, count() AS n FROM system.parts "
        "WHERE database = {db:String} AND table = {t:String} AND active AND rows > 0",
        {"db": store.database, "t": "spans"},
    ).to_pylist()[0]
    cutoff = oldest["d"] if oldest["n"] else None
    out: dict[str, set[str]] = {"run_id": set(), "origin_task_id": set()}
    for partition, keys in out.items():
        held, early = [], []
        for name, item in maintained().items():
            if item.partition != partition or name not in states or states[name].seq is None:
                continue
            columns = table_columns(store, item.table)
            if not columns:
                continue
            current = (
                f"FROM {qualified(store, item.table)} WHERE {current_rows(store, name, states[name].base)}"
            )
            held.append(f"SELECT DISTINCT `{PART}` AS k {current}")
            if cutoff is not None and "first_seen" in columns:
                early.append(
                    f"SELECT DISTINCT `{PART}` AS k {current} AND first_seen < toDateTime64({{cutoff:String}}, 6)"
                )
        if not held:
            continue
        rows = store.execute(
            f"SELECT DISTINCT k FROM ({' UNION ALL '.join(held)}) "
            "WHERE k NOT IN ('', {null_part:String}) "
            f"AND k NOT IN (SELECT `{partition}` FROM {spans} WHERE `{partition}` IS NOT NULL)",
            {"null_part": NULL_PART},
        )
        keys.update(rows.column("k").to_pylist() if rows.num_rows else [])
        if early:
            rows = store.execute(
                f"SELECT DISTINCT k FROM ({' UNION ALL '.join(early)}) WHERE k NOT IN ('', {{null_part:String}})",
                {"null_part": NULL_PART, "cutoff": cutoff},
            )
            keys.update(rows.column("k").to_pylist() if rows.num_rows else [])
    if out["run_id"]:
        rows = store.execute(
            f"SELECT DISTINCT origin_task_id AS k FROM {spans} "
            "WHERE origin_task_id IS NOT NULL AND run_id IN {runs:Array(String)}",
            {"runs": sorted(out["run_id"])},
        )
        out["origin_task_id"].update(rows.column("k").to_pylist() if rows.num_rows else [])
    return [(partition, key) for partition, keys in out.items() for key in sorted(keys)]


def log_expired(store, changes) -> int:
    """Log the partitions whose spans are gone (``expired_partitions``) as one change of
    ``changes`` (the store's ``ChangeLog``), so the next pass recomputes them, empty: their
    findings leave the tables, the run summary and the results kept whole. Returns how many."""
    gone = expired_partitions(store)
    if not gone:
        return 0
    seq = changes.begin(gone)
    changes.commit(seq, "expired", 0)
    runs = sum(1 for partition, _ in gone if partition == "run_id")
    logger.info(
        "retention: the spans of %d run(s) and %d origin task(s) are gone from the store (TTL); "
        "their findings are recomputed as change %d",
        runs,
        len(gone) - runs,
        seq,
    )
    return len(gone)


# ----------------------------------------------------------------------------------------- serve


class ClickHouseMaterializer(threading.Thread):
    """``serve --store``'s thread: brings the store's findings tables up to date after the
    writer's changes (its computations take ``turn``, the read API's turns on the store)."""

    def __init__(
        self,
        store,
        turn: threading.Lock | None = None,
        interval: float = 0.5,
        ingest_backlog: Callable[[], int] | None = None,
        commits: Callable[[], int] | None = None,
        changes=None,
    ) -> None:
        super().__init__(name="driftscope-clickhouse-materializer", daemon=True)
        self.store, self.turn, self.interval = store, turn, interval
        # the store's change log (``collector.clickhouse_changes.ChangeLog``): with it, passes
        # also log the partitions whose spans expired (``log_expired``), every EXPIRY_CHECK_S
        self.changes = changes
        self._expiry_checked: float | None = None
        self.expired_partitions = 0  # logged as expired since start (health)
        # requests waiting for the writer (``len(IngestQueue)``) and the writer's commits so far:
        # ingest first, as on DuckDB, and here also while the writer keeps committing
        self._ingest_backlog = ingest_backlog
        self._commits = commits
        self._seen_commits = -1
        self._deferred = 0.0  # seconds this pass waited for ingest
        self.deferred_seconds = 0.0
        self._stop_event = threading.Event()
        self._whole_due = materialize.WholeSchedule()  # results kept whole: as often as they are cheap
        self.passes = 0
        self.last_error: str | None = None
        self.last_failed: dict[str, str] = {}
        self.last_pass_seconds = 0.0
        self.pass_seconds_total = 0.0
        self._since_prune = 0

    def versions(self) -> RowVersions:
        """Row versions continuing from the store's (what ``run_once`` takes)."""
        return RowVersions(self.store)

    def _ingesting(self) -> bool:
        """Requests queue for the writer, or it committed since the last look."""
        if self._ingest_backlog is not None and self._ingest_backlog() >= materialize.INGEST_BACKLOG:
            return True
        if self._commits is None:
            return False
        commits = self._commits()
        moved, self._seen_commits = commits != self._seen_commits, commits
        return moved

    def _yield_to_ingest(self, name: str) -> None:  # noqa: ARG002 - bring_up_to_date's hook
        """Before each result: while ingest goes on (requests queue for the writer, or it
        committed in the last ``INGEST_POLL_S``), wait, up to ``materialize.INGEST_MAX_DEFER_S`` a
        pass: chdb runs one statement at a time, so a pass's statements sit between the inserts,
        and a pass recomputes each touched run from its spans (CPU the inserts need). Under
        sustained ingest the tables then move about once per ``INGEST_MAX_DEFER_S`` plus a pass."""
        while self._ingesting() and self._deferred < materialize.INGEST_MAX_DEFER_S:
            if self._stop_event.wait(materialize.INGEST_POLL_S):
                return
            self._deferred += materialize.INGEST_POLL_S
            self.deferred_seconds += materialize.INGEST_POLL_S

    def run_once(self, versions: RowVersions) -> PassReport:
        started = time.perf_counter()
        self._deferred = 0.0
        now = time.monotonic()
        if self.changes is not None and (
            self._expiry_checked is None or now - self._expiry_checked >= EXPIRY_CHECK_S
        ):
            self._expiry_checked = now
            with self.turn or nullcontext():
                self.expired_partitions += log_expired(self.store, self.changes)
        report = bring_up_to_date(
            self.store,
            whole_due=self._whole_due,
            turn=self.turn,
            versions=versions,
            between=self._yield_to_ingest,
        )
        self._whole_due.took(report.compute_seconds)
        if report.recomputed:
            self._since_prune += 1
        if self._since_prune >= PRUNE_EVERY:
            with self.turn or nullcontext():
                prune(self.store)
            self._since_prune = 0
        self.passes += 1
        self.last_failed = dict(report.failed or {})
        self.last_pass_seconds = time.perf_counter() - started
        self.pass_seconds_total += self.last_pass_seconds
        return report

    def run(self) -> None:
        versions = None
        while not self._stop_event.is_set():
            report = None
            try:
                versions = versions or self.versions()
                report = self.run_once(versions)
                self.last_error = None
            except Exception as exc:  # noqa: BLE001 - keep going; health shows the error
                self.last_error = f"{type(exc).__name__}: {exc}"
                logger.warning("ClickHouse materializer pass failed (will retry): %s", self.last_error)
            if report is not None and report.recomputed and not self._stop_event.is_set():
                continue  # more may have arrived meanwhile
            self._stop_event.wait(self.interval)

    def health(self) -> dict[str, Any]:
        """The thread's counters for serve's health answer."""
        return {
            "materializer_passes": self.passes,
            "last_pass_seconds": round(self.last_pass_seconds, 3),
            "deferred_to_ingest_seconds": round(self.deferred_seconds, 2),
            "pass_seconds_total": round(self.pass_seconds_total, 2),
            "expired_partitions": self.expired_partitions,
            "last_error": self.last_error,
            "failed": self.last_failed,
        }

    def stop(self, timeout: float = 30.0) -> None:
        self._stop_event.set()
        self.join(timeout)
