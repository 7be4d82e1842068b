"""context_drift_holders kept from state folded as spans commit, not recomputed per run.

A holding (an agent's reads of one version of a subject: an objective, or a state key such as a
policy) and what makes it a finding are facts of few spans each: when the agent first read the
version, its next observation of the subject with another version (the holding's end), its
first write of the subject after that first read, when a version was first seen, an agent's
last span. Each is a least or greatest value over the spans, so the state keeps them per key
and a pass merges the new spans in (``compute``) instead of reading every span of every touched
run again (with a fleet of crews streaming, every run is touched every few seconds).

The state, partitioned by run:

* ``findings__context_holdings``: per (run, agent, subject, version) the agent read: the first
  read (start, span), the first flagged read, the end (start, span) and the first write after
  the first read;
* ``findings__context_versions``: per (run, subject, version): first seen (start, span) and
  whether any observation flagged it superseded;
* ``findings__context_keys``: per (run, agent, subject): the latest observation or write;
* ``findings__context_agents``: per (run, agent): the end of its last span.

Merging is exact when a (run, agent, subject)'s new observations all start after the latest one
the state holds (in order: the first read, the end and the first write of a kept holding can
then only be filled, never moved); a key whose new spans start earlier is computed again from
its spans. A span a walk changed after it was folded is merged as a new one when the walk only
gave it an agent or a run it had none of (a parent arriving after its children:
``change_log.walks_add_only``); a run whose folded spans a walk took something from (their run
or agent) or a delete changed is computed again whole (``materialize.keys_of_folded_changes``
with the state's mark, as in ``analytics.loops_fold``). context_drift_holders is then a few
joins of the touched runs' state (``_FOUND_SQL``; the rules shared with the detector's SQL as
fragments); its full computation (``context_drift_holders.sql``) stays what cut windows and
filters compute and what the tests hold the table to (tests/analytics/test_materialize.py,
tests/analytics/test_context_fold.py). Where this gains little: docs/performance.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime

import duckdb
import pandas as pd
import pyarrow as pa

from analytics.context import context_drift_holders
from analytics.materialize import (
    PARTS,
    TABLE_PREFIX,
    Maintained,
    SpanChanges,
    detector_compute,
    kept_mark,
    keys_of_folded_changes,
    maintain,
    maintain_with,
    read_mark,
    ready,
    run_chunks,
    run_scope,
    table_exists,
    write_mark,
)
from analytics.sql_loader import (
    expand_fragments,
    filter_params,
    query_arrow,
    query_df,
    quote_identifier,
)
from analytics.types import Filters, Window

STATE = "context_holdings"
HOLDINGS = TABLE_PREFIX + STATE
VERSIONS = TABLE_PREFIX + "context_versions"
KEYS = TABLE_PREFIX + "context_keys"
AGENTS = TABLE_PREFIX + "context_agents"
MARK = TABLE_PREFIX + "context_mark"
# Each table's key columns: its rows are replaced by key.
_KEY = {
    HOLDINGS: ("run_id", "agent_id", "subject", "version"),
    VERSIONS: ("run_id", "subject", "version"),
    KEYS: ("run_id", "agent_id", "subject"),
    AGENTS: ("run_id", "agent_id"),
}
TABLES = tuple(_KEY)

# ------------------------------------------------------------------------- state from the spans

# Every observation of the spans of {span_filter} (the shared fragment, _held_versions.sql),
# and every write of a state key whatever its outcome (a refused write is a conflict too), of
# the keys in {only_keys} (a SEMI JOIN on the registered _context_redo_keys, or nothing).
_OBS = """
obs AS MATERIALIZED (SELECT o.* FROM ({held_versions}) o {only_keys}),
writes AS MATERIALIZED (
    SELECT o.* FROM (SELECT run_id, agent_id, state_key AS subject, start_ns FROM spans
                     WHERE {span_filter} AND op = 'write' AND state_key IS NOT NULL
                       AND agent_id IS NOT NULL AND run_id IS NOT NULL) o {only_keys}
)"""

# A holding's end is the first observation of the subject by its agent with another version
# strictly after its first read, in (start, version, span id) order: the next stretch of one
# version after the first read's (islands, linear in the observations: comparing every holding
# with every observation grew with the square of them on a hot key), or, when that stretch
# starts at the very moment of the first read, looked up. Its first write: the agent's first
# write of the subject after the first read (an as-of join).
_HOLDINGS_SQL = (
    "WITH "
    + _OBS
    + """,
held AS (
    SELECT run_id, agent_id, subject, version, min(start_ns) AS hold_start_ns,
           arg_min(SpanId, {'n': start_ns, 's': SpanId}) AS read_span_id,
           min(start_ns) FILTER (WHERE flagged) AS flagged_ns
    FROM obs WHERE NOT is_write
    GROUP BY ALL
),
islands AS (
    SELECT *, sum(starts::INTEGER) OVER (PARTITION BY run_id, agent_id, subject
                                         ORDER BY start_ns, version, SpanId
                                         ROWS UNBOUNDED PRECEDING) AS island
    FROM (SELECT run_id, agent_id, subject, version, start_ns, SpanId,
                 coalesce(lag(version) OVER (PARTITION BY run_id, agent_id, subject
                                             ORDER BY start_ns, version, SpanId) <> version,
                          true) AS starts
          FROM obs)
),
next_island AS (
    SELECT h.run_id, h.agent_id, h.subject, h.version, h.hold_start_ns,
           s.start_ns AS next_ns, s.SpanId AS next_span
    FROM (SELECT h.run_id, h.agent_id, h.subject, h.version, h.hold_start_ns, max(i.island) AS island
          FROM held h
          JOIN islands i ON i.run_id = h.run_id AND i.agent_id = h.agent_id AND i.subject = h.subject
                        AND i.version = h.version AND i.start_ns = h.hold_start_ns
          GROUP BY ALL) h
    JOIN islands s ON s.run_id = h.run_id AND s.agent_id = h.agent_id AND s.subject = h.subject
                  AND s.island = h.island + 1 AND s.starts
),
ended AS (
    SELECT run_id, agent_id, subject, version, next_ns AS end_ns, next_span AS end_span_id
    FROM next_island WHERE next_ns > hold_start_ns
    UNION ALL
    SELECT t.run_id, t.agent_id, t.subject, t.version, min(o.start_ns),
           arg_min(o.SpanId, {'n': o.start_ns, 'v': o.version, 's': o.SpanId})
    FROM next_island t
    JOIN obs o ON o.run_id = t.run_id AND o.agent_id = t.agent_id AND o.subject = t.subject
              AND o.version <> t.version AND o.start_ns > t.hold_start_ns
    WHERE t.next_ns = t.hold_start_ns
    GROUP BY ALL
),
first_write AS (
    SELECT h.run_id, h.agent_id, h.subject, h.version, w.start_ns AS first_write_ns
    FROM held h ASOF JOIN writes w
      ON w.run_id = h.run_id AND w.agent_id = h.agent_id AND w.subject = h.subject
     AND h.hold_start_ns < w.start_ns
)
SELECT h.run_id, h.agent_id, h.subject, h.version, h.hold_start_ns, h.read_span_id, h.flagged_ns,
       e.end_ns, e.end_span_id, w.first_write_ns
FROM held h
LEFT JOIN ended e USING (run_id, agent_id, subject, version)
LEFT JOIN first_write w USING (run_id, agent_id, subject, version)
"""
)

_VERSIONS_SQL = """
SELECT run_id, subject, version, min(start_ns) AS first_ns,
       arg_min(SpanId, {'n': start_ns, 's': SpanId}) AS first_span, bool_or(flagged) AS any_flagged
FROM ({held_versions})
GROUP BY ALL
"""

_KEYS_SQL = (
    "WITH "
    + _OBS
    + """
SELECT run_id, agent_id, subject, max(start_ns) AS last_ns
FROM (SELECT run_id, agent_id, subject, start_ns FROM obs
      UNION ALL SELECT run_id, agent_id, subject, start_ns FROM writes)
GROUP BY ALL
"""
)

_AGENTS_SQL = """
SELECT run_id, agent_id, max(end_ns) AS last_ns
FROM spans
WHERE {span_filter} AND run_id IS NOT NULL AND agent_id IS NOT NULL
GROUP BY ALL
"""

_FROM_SPANS = {HOLDINGS: _HOLDINGS_SQL, VERSIONS: _VERSIONS_SQL, KEYS: _KEYS_SQL, AGENTS: _AGENTS_SQL}

# ----------------------------------------------------------------------------- the new spans

# The columns of the spans the changes $after < seq <= $upto stored or changed (newest row groups
# only: the changes' ingest bound) that the state is made of, but those of the runs $redo
# (computed again from their spans): read once a pass (``_context_new``), then named ``spans``
# in each statement so the shared fragments read them as they read the table.
_NEW_SPANS_READ = """
SELECT s.TraceId, s.SpanId, s.run_id, s.agent_id, s.op, s.outcome, s.start_ns, s.end_ns, s.state_key,
       s.state_version, s.objective_id, s.objective_version, s.objective_superseded
FROM spans s
SEMI JOIN (SELECT DISTINCT TraceId, SpanId FROM span_changes WHERE seq > $after AND seq <= $upto) c
    ON c.TraceId = s.TraceId AND c.SpanId = s.SpanId
WHERE s.ingested_at >= $since_ingested AND NOT (s.run_id = ANY($redo::VARCHAR[]))
"""
_NEW_SPANS = "spans AS (SELECT * FROM _context_new)"

# The kept rows of the keys the new spans touch, merged with them: least and greatest values.
_MERGE_SQL = {
    VERSIONS: "WITH "
    + _NEW_SPANS
    + """,
new AS ("""
    + _VERSIONS_SQL
    + f""")
SELECT run_id, subject, version, min(first_ns) AS first_ns,
       arg_min(first_span, {{'n': first_ns, 's': first_span}}) AS first_span, bool_or(any_flagged) AS any_flagged
FROM (SELECT * FROM new
      UNION ALL
      SELECT k.* FROM {quote_identifier(VERSIONS)} k SEMI JOIN new USING (run_id, subject, version))
GROUP BY ALL
""",
    KEYS: "WITH "
    + _NEW_SPANS
    + """,
new AS ("""
    + _KEYS_SQL
    + f""")
SELECT run_id, agent_id, subject, max(last_ns) AS last_ns
FROM (SELECT * FROM new
      UNION ALL
      SELECT k.* FROM {quote_identifier(KEYS)} k SEMI JOIN new USING (run_id, agent_id, subject))
GROUP BY ALL
""",
    AGENTS: "WITH "
    + _NEW_SPANS
    + """,
new AS ("""
    + _AGENTS_SQL
    + f""")
SELECT run_id, agent_id, max(last_ns) AS last_ns
FROM (SELECT * FROM new
      UNION ALL
      SELECT k.* FROM {quote_identifier(AGENTS)} k SEMI JOIN new USING (run_id, agent_id))
GROUP BY ALL
""",
}

# The (run, agent, subject) keys the new spans observe or write, and whether they come in order:
# every new observation and write after the latest the state holds for the key.
_NEW_KEYS_SQL = (
    "WITH "
    + _NEW_SPANS
    + ", "
    + _OBS
    + f"""
SELECT n.run_id, n.agent_id, n.subject, k.last_ns IS NULL OR n.first_ns > k.last_ns AS in_order
FROM (SELECT run_id, agent_id, subject, min(start_ns) AS first_ns
      FROM (SELECT run_id, agent_id, subject, start_ns FROM obs
            UNION ALL SELECT run_id, agent_id, subject, start_ns FROM writes)
      GROUP BY ALL) n
LEFT JOIN {quote_identifier(KEYS)} k USING (run_id, agent_id, subject)
"""
)

# The holdings of the keys that came in order (_context_in_order) after the new spans: a kept
# holding keeps its first read; its end, first write and first flagged read are filled when it
# has none yet (every new span is later than every kept one); a new version read is a new
# holding. Only the rows that change.
_MERGE_HOLDINGS_SQL = (
    "WITH "
    + _NEW_SPANS
    + ", "
    + _OBS.replace("{only_keys}", "SEMI JOIN _context_in_order USING (run_id, agent_id, subject)")
    + f""",
kept AS (SELECT h.* FROM {quote_identifier(HOLDINGS)} h SEMI JOIN _context_in_order USING (run_id, agent_id, subject)),
new AS (
    SELECT run_id, agent_id, subject, version, min(start_ns) AS hold_start_ns,
           arg_min(SpanId, {{'n': start_ns, 's': SpanId}}) AS read_span_id,
           min(start_ns) FILTER (WHERE flagged) AS flagged_ns
    FROM obs WHERE NOT is_write
    GROUP BY ALL
),
merged AS (
    SELECT coalesce(k.run_id, n.run_id) AS run_id, coalesce(k.agent_id, n.agent_id) AS agent_id,
           coalesce(k.subject, n.subject) AS subject, coalesce(k.version, n.version) AS version,
           coalesce(k.hold_start_ns, n.hold_start_ns) AS hold_start_ns,
           coalesce(k.read_span_id, n.read_span_id) AS read_span_id,
           coalesce(k.flagged_ns, n.flagged_ns) AS flagged_ns,
           k.end_ns, k.end_span_id, k.first_write_ns,
           k.run_id IS NULL OR (k.flagged_ns IS NULL AND n.flagged_ns IS NOT NULL) AS changed
    FROM kept k
    FULL JOIN new n ON n.run_id = k.run_id AND n.agent_id = k.agent_id AND n.subject = k.subject
                   AND n.version = k.version
),
ends AS (
    SELECT m.run_id, m.agent_id, m.subject, m.version,
           min({{'n': o.start_ns, 'v': o.version, 's': o.SpanId}}) AS nxt
    FROM merged m
    JOIN obs o ON o.run_id = m.run_id AND o.agent_id = m.agent_id AND o.subject = m.subject
              AND o.version <> m.version AND o.start_ns > m.hold_start_ns
    WHERE m.end_ns IS NULL
    GROUP BY ALL
),
writes_after AS (
    SELECT m.run_id, m.agent_id, m.subject, m.version, min(w.start_ns) AS first_write_ns
    FROM merged m
    JOIN writes w ON w.run_id = m.run_id AND w.agent_id = m.agent_id AND w.subject = m.subject
                 AND w.start_ns > m.hold_start_ns
    WHERE m.first_write_ns IS NULL
    GROUP BY ALL
)
SELECT m.run_id, m.agent_id, m.subject, m.version, m.hold_start_ns, m.read_span_id, m.flagged_ns,
       coalesce(m.end_ns, e.nxt.n) AS end_ns, coalesce(m.end_span_id, e.nxt.s) AS end_span_id,
       coalesce(m.first_write_ns, w.first_write_ns) AS first_write_ns
FROM merged m
LEFT JOIN ends e USING (run_id, agent_id, subject, version)
LEFT JOIN writes_after w USING (run_id, agent_id, subject, version)
WHERE m.changed OR e.nxt IS NOT NULL OR w.first_write_ns IS NOT NULL
"""
)


@dataclasses.dataclass
class Fold:
    """What a pass changes in the state: per table the rows to put in (replacing the rows of
    their keys), the runs whose rows all go first (``redo``; None: every row, a build), the
    (run, agent, subject) keys whose holdings all go first, and the state's new mark."""

    rows: dict[str, pa.Table]
    redo: list[str] | None
    keys: pa.Table | None = None
    mark: datetime | None = None
    counts_: dict[str, int] = dataclasses.field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        """What the fold did, for health: keys merged in order, keys and runs computed again
        from their spans, holdings written."""
        return self.counts_


def _state_of(
    conn: duckdb.DuckDBPyConnection, runs: list[str] | None, keys: pa.Table | None = None
) -> dict[str, pa.Table]:
    """Every state table's rows of ``runs`` (every run when None) computed from their spans; of
    the (run, agent, subject) ``keys`` only when given (holdings alone)."""
    params = filter_params(Window(), run_scope(conn, runs))
    if keys is not None:
        conn.register("_context_redo_keys", keys)
    try:
        out = {}
        for table, sql in _FROM_SPANS.items():
            if keys is not None and table != HOLDINGS:
                continue
            only = (
                "SEMI JOIN _context_redo_keys USING (run_id, agent_id, subject)" if keys is not None else ""
            )
            out[table] = query_arrow(conn, expand_fragments(sql.replace("{only_keys}", only)), params)
        return out
    finally:
        if keys is not None:
            conn.unregister("_context_redo_keys")


def compute(conn: duckdb.DuckDBPyConnection, partition: str | None, changes: SpanChanges | None) -> Fold:
    """The state's change for the spans ``changes`` lists (every span when None)."""
    if changes is None or not table_exists(conn, HOLDINGS):
        return _build(conn)
    mark = kept_mark(conn, MARK)
    bounded = changes.bounded_params()
    redo: list[str] = []
    if not changes.only_new or mark is None:
        # the runs to compute again whole: those of the changes that deleted spans or changed one
        # the state may hold already in a way that takes back what it said (its run, agent or
        # operation; a walk that only gave it an agent or run is merged as new spans are)
        redo = keys_of_folded_changes(conn, "run_id", changes, mark, adds_only=True)
    params = {k: None for k in filter_params(Window(), Filters())}
    conn.register("_context_new", conn.execute(_NEW_SPANS_READ, {**bounded, "redo": redo}).to_arrow_table())
    try:
        keys = query_arrow(conn, expand_fragments(_NEW_KEYS_SQL.replace("{only_keys}", "")), params)
        in_order = keys.filter(keys.column("in_order")).select(["run_id", "agent_id", "subject"])
        late = keys.filter(pa.compute.invert(keys.column("in_order"))).select(
            ["run_id", "agent_id", "subject"]
        )
        rows: dict[str, list[pa.Table]] = {table: [] for table in TABLES}
        for table, sql in _MERGE_SQL.items():
            rows[table].append(query_arrow(conn, expand_fragments(sql.replace("{only_keys}", "")), params))
        conn.register("_context_in_order", in_order)
        try:
            rows[HOLDINGS].append(query_arrow(conn, expand_fragments(_MERGE_HOLDINGS_SQL), params))
        finally:
            conn.unregister("_context_in_order")
    finally:
        conn.unregister("_context_new")
    if late.num_rows:
        late_runs = sorted(set(late.column("run_id").to_pylist()))
        rows[HOLDINGS].append(_state_of(conn, late_runs, late)[HOLDINGS])
    if redo:
        for table, part in _state_of(conn, redo).items():
            rows[table].append(part)
    merged = {table: pa.concat_tables(parts) if len(parts) > 1 else parts[0] for table, parts in rows.items()}
    counts = {
        "keys_merged": in_order.num_rows,
        "keys_from_spans": late.num_rows,
        "runs_from_spans": len(redo),
        "holdings_written": merged[HOLDINGS].num_rows,
    }
    return Fold(merged, redo, late if late.num_rows else None, read_mark(conn, mark), counts)


def build(conn: duckdb.DuckDBPyConnection, upto: int | None = None) -> Iterator[Fold]:
    """The first build, a chunk of runs at a time: the first part replaces the tables, each
    later one adds its runs' rows."""
    mark = None
    for number, chunk in enumerate(run_chunks(conn, BUILD_CHUNK_SPANS)):
        rows = _state_of(conn, chunk or None)
        mark = read_mark(conn, mark)  # the last part's bounds every part's reads
        yield Fold(rows, None if number == 0 else chunk, None, mark)


# Spans of one part of the first build.
BUILD_CHUNK_SPANS = 500_000


def _build(conn: duckdb.DuckDBPyConnection) -> Fold:
    parts = list(build(conn))
    rows = {table: pa.concat_tables([part.rows[table] for part in parts]) for table in TABLES}
    return Fold(rows, None, None, parts[-1].mark)


def apply(conn: duckdb.DuckDBPyConnection, fold: Fold) -> None:
    """In the writer's transaction: the rows of ``fold`` replace those of their keys, after the
    rows of its runs computed again (and of its keys' holdings) are removed."""
    write_mark(conn, MARK, fold.mark)
    for table in TABLES:
        name = quote_identifier(table)
        rows = fold.rows[table]
        conn.register("_context_rows", rows)
        try:
            if fold.redo is None:  # a build's first part
                conn.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM _context_rows")
                continue
            if fold.redo:
                conn.execute(f"DELETE FROM {name} WHERE run_id = ANY($runs::VARCHAR[])", {"runs": fold.redo})
            if table == HOLDINGS and fold.keys is not None:
                conn.register("_context_keys", fold.keys)
                try:
                    conn.execute(
                        f"DELETE FROM {name} t USING _context_keys k WHERE t.run_id = k.run_id "
                        "AND t.agent_id = k.agent_id AND t.subject = k.subject"
                    )
                finally:
                    conn.unregister("_context_keys")
            if rows.num_rows:
                match = " AND ".join(f"t.{c} = r.{c}" for c in _KEY[table])
                conn.execute(f"DELETE FROM {name} t USING _context_rows r WHERE {match}")
                conn.execute(f"INSERT INTO {name} SELECT * FROM _context_rows")
        finally:
            conn.unregister("_context_rows")


# --------------------------------------------------------------------------- the findings

# context_drift_holders.sql's holdings found, from the state of the runs $runs (every run when
# NULL): the same supersession, staleness, write-conflict and current-version rules.
_FOUND_SQL = f"""
WITH version_first AS (
    SELECT * FROM {quote_identifier(VERSIONS)}
    WHERE ($runs::VARCHAR[] IS NULL OR run_id = ANY($runs::VARCHAR[]))
),
{{context_versions}},
held AS (
    SELECT * FROM (
        SELECT h.*, v.newer_ns, v.superseded_by, v.supersede_span_id,
               coalesce(h.end_ns, a.last_ns) AS hold_end_ns,
               greatest(h.hold_start_ns, coalesce(least(v.newer_ns, h.flagged_ns), v.newer_ns, h.flagged_ns))
                   AS stale_from_ns
        FROM {quote_identifier(HOLDINGS)} h
        JOIN open_versions v USING (run_id, subject, version)
        LEFT JOIN {quote_identifier(AGENTS)} a USING (run_id, agent_id)
        WHERE ($runs::VARCHAR[] IS NULL OR h.run_id = ANY($runs::VARCHAR[]))
          AND coalesce(v.newer_ns, h.flagged_ns) IS NOT NULL)
    WHERE (stale_from_ns < hold_end_ns OR flagged_ns IS NOT NULL)  -- held past going stale
      AND NOT coalesce(first_write_ns <= hold_end_ns, false)       -- not a write conflict
),
{{context_found}}
SELECT * FROM found
"""

# The found holdings (_context_found) with their evidence, every read of the held version by the
# holder, from the spans of their runs: context_drift_holders.sql's rows.
_EVIDENCE_SQL = """
WITH obs AS NOT MATERIALIZED ({held_versions}),
found AS (SELECT * FROM _context_found),
{context_evidence}
"""


def _holders(conn: duckdb.DuckDBPyConnection, partition: str | None, runs: list[str] | None) -> pd.DataFrame:
    """context_drift_holders' rows of ``runs`` (every run when None) from the state; its full
    computation when the state cannot say (not built by this definition, or failed)."""
    state = ready(conn, STATE)
    if state is None or state.failed_keys:
        return _computed(conn, partition, runs)
    found = query_arrow(conn, expand_fragments(_FOUND_SQL), {"runs": runs})
    found_runs = sorted(set(found.column("run_id").to_pylist()))
    conn.register("_context_found", found)
    try:
        params = filter_params(Window(), run_scope(conn, found_runs))
        return query_df(conn, expand_fragments(_EVIDENCE_SQL), params)
    finally:
        conn.unregister("_context_found")


_computed = detector_compute(context_drift_holders)
maintain(Maintained(STATE, "span", compute, (), "1", apply=apply, build=build))
PARTS.add(STATE)
maintain_with("context_drift_holders", _holders, depends=(STATE,))
