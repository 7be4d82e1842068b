"""The DuckDB store: opening the file, turning decoded batches into Arrow, inserting them.

Only the writer thread (``collector.writer.SpanWriter``) calls ``insert_batches`` on a live
server; ``driftscope ingest --db`` uses the same functions on a file no server holds.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from collector.changes import next_change, record_run_tools, record_touched
from collector.decode import SPAN_SCHEMA, DecodedBatch
from collector.migrations_runner import apply_migrations

logger = logging.getLogger(__name__)


CHECKPOINT_THRESHOLD = "256MB"


class StoreLockedError(RuntimeError):
    """Another process (usually a running ``driftscope serve``) holds the database file."""


def open_store(
    path: str | os.PathLike, read_only: bool = False, memory_limit: int | None = None
) -> duckdb.DuckDBPyConnection:
    """Open (creating and migrating if needed) the database file at ``path``.

    ``memory_limit`` (bytes) caps DuckDB's buffer pool (its default is 80% of RAM, which it keeps
    filling with cached blocks as the file grows); beyond it DuckDB evicts and spills to disk.

    Raises ``StoreLockedError`` with an actionable message when another process holds it.
    """
    path = Path(path)
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = duckdb.connect(str(path), read_only=read_only)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise StoreLockedError(
                f"The database {path} is held by another process (a running `driftscope serve`?). "
                "Send spans to that server with --endpoint URL instead, or stop it first; for "
                "offline analysis copy the file and open the copy."
            ) from exc
        raise
    if memory_limit is not None:
        conn.execute(f"SET memory_limit = '{int(memory_limit)}B'")
    if not read_only:
        apply_migrations(conn)
        # DuckDB checkpoints (compresses the WAL into the file) inside the COMMIT that takes the
        # WAL past this size. At the default 16 MB that is every ~80k spans, and those small
        # checkpoints cost more than the inserts themselves; at 256 MB they are ~16x rarer and
        # each is cheaper per row. The writer also checkpoints whenever ingest goes idle.
        conn.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
    return conn


def batch_to_arrow(batches: list[DecodedBatch]) -> pa.Table:
    """Concatenate decoded batches into one Arrow table with the `spans` schema."""
    tables = [batch.table for batch in batches if batch.table.num_rows]
    if not tables:
        return SPAN_SCHEMA.empty_table()
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)


# The spans of the traces a commit touches, read from `spans` in one scan; the ancestor walks
# below then join this small table instead of scanning `spans` once per step of the recursion.
# `ingested_at >= $since` lets the scan skip every row group older than the touched traces'
# first stored span (row-group min/max), so its cost follows recent traffic, not table size.
_TREE_SQL = """
CREATE OR REPLACE TEMP TABLE _tree AS
SELECT rowid AS rid, TraceId, SpanId, ParentSpanId, agent_id, agent_name, run_id, origin_task_id, span_family,
       start_ns,
       -- spans of driftscope's guards state their own delegation hops and runs
       (task_id IS NOT NULL OR guard IS NOT NULL OR scenario IS NOT NULL) AS guarded,
       -- what the walks below may change and what names a (run, tool) key, as it was before them
       -- (the walks update run_id above; _CHANGED_SQL compares), for the change log
       run_id AS run_before, tool_name, delegate_to, SpanName, op, hop, hash(input_text) AS input_hash,
       span_family = 'llm' AND (contains(output_text, '<code>') OR contains(output_text, '```')) AS has_code
FROM spans WHERE ingested_at >= $since AND TraceId IN (SELECT TraceId FROM _incoming)
"""


# Spans already stored (same TraceId + SpanId, as exporter retries resend) are skipped: the first
# stored copy wins. Only the touched traces' rows from `$since` on can match (see TraceIndex), so
# this replaces a PRIMARY KEY index without reading the whole table. It returns the ids it
# stored: a resend changes nothing, so the change log does not list it.
_INSERT_NEW_SQL = """
INSERT INTO spans
SELECT i.* FROM _incoming i
WHERE NOT EXISTS (
    SELECT 1 FROM spans s
    WHERE s.ingested_at >= $since AND s.TraceId = i.TraceId AND s.SpanId = i.SpanId
)
RETURNING TraceId, SpanId
"""


class TraceIndex:
    """When each stored trace's earliest span was ingested, for the one process writing a file.

    A commit's ancestor walk must see the earlier spans of the traces it touches; knowing the
    earliest ``ingested_at`` of those traces bounds the scan to the recent part of `spans`
    (traces seen for the first time need no scan of older rows at all). Loaded once from the
    file (one entry per trace: ~150 bytes of memory per stored trace), then kept current by
    ``insert_batches``. Entries of traces that retention deleted stay until the next start; they
    only make a bound looser, never wrong.
    """

    def __init__(self, conn: duckdb.DuckDBPyConnection) -> None:
        self._first: dict[str, object] = dict(
            conn.execute("SELECT TraceId, min(ingested_at) FROM spans GROUP BY TraceId").fetchall()
        )

    def __len__(self) -> int:
        return len(self._first)

    def since(self, tables: list[pa.Table]) -> object:
        """The lower bound on ``ingested_at`` for the traces of the rows about to be stored
        (each decoded batch's rows share one ``ingested_at``); records those traces."""
        first = self._first
        bound = None
        for table in tables:
            if not table.num_rows:
                continue
            at = pc.min(table.column("ingested_at")).as_py()
            for trace in pc.unique(table.column("TraceId")).to_pylist():
                known = first.get(trace)
                if known is None or at < known:
                    first[trace] = known = at
                if bound is None or known < bound:
                    bound = known
        return bound


_TREE_NEEDS_WORK_SQL = """
SELECT count(*) FILTER (WHERE agent_id IS NULL AND ParentSpanId <> ''),
       count(*) FILTER (WHERE run_id = TraceId AND ParentSpanId <> ''),
       count(*) FILTER (WHERE span_family = 'agent' AND run_id <> TraceId AND NOT guarded AND ParentSpanId <> ''),
       count(*) FILTER (WHERE span_family = 'agent' AND agent_id IS NOT NULL AND NOT guarded AND ParentSpanId <> ''),
       bool_or(run_id = TraceId) AND bool_or(run_id <> TraceId)
FROM _tree
"""

# An agent invoked from a span of another run belongs to that run: PydanticAI gives every
# delegated `agent.run(...)` a generated conversation id of its own, Google ADK every agent called
# as a tool a nested session (its `invoke_workflow` span, a chain, in the caller's tool span).
# Repeated (in Python) while a nesting level is merged, so chains of delegation end in the
# outermost run.
_MERGE_NESTED_RUNS_SQL = """
CREATE OR REPLACE TEMP TABLE _run_merge AS
SELECT DISTINCT c.TraceId, c.run_id AS inner_run, p.run_id AS outer_run
FROM _tree c JOIN _tree p ON p.TraceId = c.TraceId AND p.SpanId = c.ParentSpanId
WHERE c.span_family IN ('agent', 'chain') AND NOT c.guarded AND NOT p.guarded
  AND c.run_id <> c.TraceId AND p.run_id <> p.TraceId AND c.run_id <> p.run_id;
UPDATE spans SET run_id = m.outer_run
FROM _tree t, _run_merge m
WHERE spans.rowid = t.rid AND t.TraceId = m.TraceId AND t.run_id = m.inner_run;
UPDATE _tree SET run_id = m.outer_run
FROM _run_merge m WHERE _tree.TraceId = m.TraceId AND _tree.run_id = m.inner_run;
"""

# Delegation hops from the nesting of agent spans (a managed agent's run inside its manager's,
# an agent called as a tool, a CrewAI coworker under the manager's delegation): a span's hop is
# the number of changes of agent among the agent spans on its path to the root. Recomputed for
# every span of the touched traces, since a sub-agent's spans usually arrive before the
# manager's span that makes them a hop (children end first); guarded traces state their own.
_AGENT_HOPS_SQL = """
WITH RECURSIVE walk(rid, TraceId, parent, last_agent, changes, depth) AS (
    SELECT s.rid, s.TraceId, s.ParentSpanId,
           CASE WHEN s.span_family = 'agent' THEN s.agent_id END, 0, 0
    FROM _tree s
    WHERE s.TraceId NOT IN (SELECT TraceId FROM _tree WHERE guarded)
      -- only traces with an agent nested under another span (the rest keep their hop whatever
      -- shared their request: hops must not depend on how spans were batched)
      AND s.TraceId IN (SELECT TraceId FROM _tree WHERE span_family = 'agent' AND agent_id IS NOT NULL
                                                    AND ParentSpanId <> '')
  UNION ALL
    SELECT w.rid, w.TraceId, p.ParentSpanId,
           CASE WHEN p.span_family = 'agent' AND p.agent_id IS NOT NULL THEN p.agent_id
                ELSE w.last_agent END,
           w.changes + CASE WHEN p.span_family = 'agent' AND p.agent_id IS NOT NULL
                             AND w.last_agent IS NOT NULL AND p.agent_id <> w.last_agent
                            THEN 1 ELSE 0 END,
           w.depth + 1
    FROM walk w JOIN _tree p ON p.TraceId = w.TraceId AND p.SpanId = w.parent
    WHERE w.parent <> '' AND w.depth < 256
),
hops AS (SELECT rid, max(changes)::INTEGER AS hop FROM walk GROUP BY rid)
UPDATE spans SET hop = hops.hop
FROM hops WHERE spans.rowid = hops.rid AND spans.hop IS DISTINCT FROM hops.hop
"""

# An agent called as a tool (OpenAI Agents `agent.as_tool`) or from a graph node (OpenLLMetry's
# `invoke_agent <sub-agent>` inside LangGraph's `execute_task <node>`) has no input of its own:
# its task is the input of the call that invoked it.
_AGENT_INPUT_FROM_TOOL_SQL = """
UPDATE spans SET input_text = caller.input_text
FROM (SELECT c.rid, t.input_text
      FROM _tree c
      JOIN _tree p ON p.TraceId = c.TraceId AND p.SpanId = c.ParentSpanId
      JOIN spans t ON t.rowid = p.rid
      WHERE c.span_family = 'agent' AND p.span_family IN ('tool', 'chain') AND t.input_text IS NOT NULL) caller
WHERE spans.rowid = caller.rid AND spans.input_text IS NULL
"""

# An agent span still without input (OpenAI Agents and OpenLLMetry agent spans: the request is
# only in the agent's model calls) takes the input of the first model call made under it, not
# under a nested agent.
_AGENT_INPUT_FROM_FIRST_LLM_SQL = """
WITH RECURSIVE up(rid, start_ns, TraceId, parent, depth) AS (
    SELECT l.rid, l.start_ns, l.TraceId, l.ParentSpanId, 0
    FROM _tree l WHERE l.span_family = 'llm' AND NOT l.guarded
  UNION ALL
    SELECT u.rid, u.start_ns, u.TraceId, p.ParentSpanId, u.depth + 1
    FROM up u JOIN _tree p ON p.TraceId = u.TraceId AND p.SpanId = u.parent
    WHERE p.span_family <> 'agent' AND u.depth < 64
),
owner AS (
    SELECT a.rid AS agent_rid, arg_min(u.rid, u.start_ns) AS llm_rid
    FROM up u JOIN _tree a ON a.TraceId = u.TraceId AND a.SpanId = u.parent AND a.span_family = 'agent'
    GROUP BY a.rid
)
UPDATE spans SET input_text = l.input_text
FROM owner o, spans l
WHERE spans.rowid = o.agent_rid AND l.rowid = o.llm_rid
  AND spans.input_text IS NULL AND l.input_text IS NOT NULL
"""

# A tool call that runs another agent (an agent called as a tool: a Strands / Agent Framework /
# AG2 / PydanticAI tool that runs an agent, OpenAI Agents' `as_tool`) is a delegation to that
# agent: its first agent span directly inside the tool span, of an agent other than the caller's.
# A tool span a convention already gave an op (a hand-off, a guard's) keeps it.
_TOOL_RUNS_AGENT_SQL = """
WITH invoked AS (
    SELECT t.rid, arg_min(c.agent_id, c.start_ns) AS agent
    FROM _tree t JOIN _tree c ON c.TraceId = t.TraceId AND c.ParentSpanId = t.SpanId
    WHERE t.span_family = 'tool' AND NOT t.guarded AND c.span_family = 'agent' AND c.agent_id IS NOT NULL
    GROUP BY t.rid
)
UPDATE spans SET op = 'delegate', delegate_to = invoked.agent
FROM invoked
WHERE spans.rowid = invoked.rid AND spans.op IS NULL AND spans.agent_id IS DISTINCT FROM invoked.agent
"""

# A hand-off whose target was not recorded (ADK's `transfer_to_agent` without captured arguments)
# hands over to the agent that runs next: the first agent span of another agent in its trace that
# starts after it.
_HANDOFF_TARGET_SQL = """
WITH pending AS (
    SELECT t.rid, t.TraceId, t.start_ns, s.agent_id
    FROM _tree t JOIN spans s ON s.rowid = t.rid
    WHERE s.op = 'delegate' AND s.delegate_to IS NULL AND NOT t.guarded
),
next_agent AS (
    SELECT p.rid, arg_min(a.agent_id, a.start_ns) AS agent
    FROM pending p JOIN _tree a ON a.TraceId = p.TraceId AND a.start_ns > p.start_ns
    WHERE a.span_family = 'agent' AND a.agent_id IS NOT NULL AND a.agent_id IS DISTINCT FROM p.agent_id
    GROUP BY p.rid
)
UPDATE spans SET delegate_to = next_agent.agent
FROM next_agent WHERE spans.rowid = next_agent.rid AND spans.delegate_to IS NULL
"""

# A span that names no agent takes its nearest ancestor's agent (an agent span or any span with
# an agent id), however many agentless spans lie between them (up to 256).
_INHERIT_AGENT_SQL = """
WITH RECURSIVE walk(rid, TraceId, parent, depth) AS (
    SELECT s.rid, s.TraceId, s.ParentSpanId, 0
    FROM _tree s
    WHERE s.agent_id IS NULL AND s.ParentSpanId <> ''
  UNION ALL
    SELECT w.rid, w.TraceId, p.ParentSpanId, w.depth + 1
    FROM walk w JOIN _tree p ON p.TraceId = w.TraceId AND p.SpanId = w.parent
    WHERE p.agent_id IS NULL AND p.ParentSpanId <> '' AND w.depth < 256
),
found AS (
    SELECT w.rid, p.agent_id, p.agent_name
    FROM walk w JOIN _tree p ON p.TraceId = w.TraceId AND p.SpanId = w.parent
    WHERE p.agent_id IS NOT NULL
)
UPDATE spans SET agent_id = found.agent_id, agent_name = found.agent_name, agent_source = 'ancestor'
FROM found WHERE spans.rowid = found.rid
"""

# A span whose run fell back to its trace id takes the run of its nearest ancestor that has one.
_INHERIT_RUN_SQL = """
WITH RECURSIVE walk(rid, TraceId, parent, depth) AS (
    SELECT s.rid, s.TraceId, s.ParentSpanId, 0
    FROM _tree s
    WHERE s.run_id = s.TraceId AND s.ParentSpanId <> ''
  UNION ALL
    SELECT w.rid, w.TraceId, p.ParentSpanId, w.depth + 1
    FROM walk w JOIN _tree p ON p.TraceId = w.TraceId AND p.SpanId = w.parent
    WHERE p.run_id = p.TraceId AND p.ParentSpanId <> '' AND w.depth < 256
),
found AS (
    SELECT w.rid, p.run_id
    FROM walk w JOIN _tree p ON p.TraceId = w.TraceId AND p.SpanId = w.parent
    WHERE p.run_id <> p.TraceId
)
UPDATE spans SET run_id = found.run_id
FROM found WHERE spans.rowid = found.rid
"""


# The runs the statement above gave, into the working copy the merge of nested runs reads.
_TREE_RUNS_FROM_SPANS_SQL = """
UPDATE _tree SET run_id = s.run_id
FROM spans s WHERE s.rowid = _tree.rid AND _tree.run_id IS DISTINCT FROM s.run_id
"""

# A span without a conversation id of its own (its run fell back to its trace id) whose trace
# names exactly one run belongs to that run, wherever it sits in the tree: the caller's own
# `invoke_agent` spans around `acting_as("run-42")` (siblings and parents of the run's spans, the
# root included) are part of run-42. `_tree` holds the trace's earlier spans too, so this holds
# whichever arrives first: a run id arriving later reaches the spans stored before it, and a span
# arriving after the run id takes it. A trace naming several runs keeps only the ancestor rule
# above (which of them a root span belongs to is not known).
_JOIN_TRACE_RUN_SQL = """
UPDATE spans SET run_id = r.run_id
FROM (SELECT TraceId, any_value(run_id) AS run_id FROM _tree WHERE run_id <> TraceId
      GROUP BY TraceId HAVING count(DISTINCT run_id) = 1) r, _tree s
WHERE spans.rowid = s.rid AND s.TraceId = r.TraceId AND s.run_id = s.TraceId
"""


# The spans of the traces a commit touched, as resolved (their runs may have changed).
_TOUCHED_TRACES = "WHERE ingested_at >= $since AND TraceId IN (SELECT DISTINCT TraceId FROM _tree)"


# The spans stored before this commit that the walks changed (a span whose run, agent, hop,
# hand-off or task changed; the new spans are listed anyway), with the
# (run, tool) key columns they had before (collector.changes.record_run_tools: the keys a span
# leaves; the keys it has now are read from the spans `span_changes` lists), and whether the
# walk only added to it (a run or an agent where it had none: `change_log.walks_add_only`).
_CHANGED_SQL = """
CREATE OR REPLACE TEMP TABLE _changed AS
SELECT b.TraceId, b.SpanId, b.has_code, b.run_before AS run_id, b.tool_name, b.delegate_to, b.agent_id,
       b.agent_name, b.SpanName, b.span_family,
       coalesce(b.run_before, n.run_id) IS NOT DISTINCT FROM n.run_id AND b.op IS NOT DISTINCT FROM n.op
           AND coalesce(b.agent_id, n.agent_id) IS NOT DISTINCT FROM n.agent_id AS added_only
FROM (SELECT * FROM _tree
      ANTI JOIN _stored i
      ON i.TraceId = _tree.TraceId AND i.SpanId = _tree.SpanId) b
JOIN spans n ON n.rowid = b.rid
WHERE b.run_before IS DISTINCT FROM n.run_id OR b.agent_id IS DISTINCT FROM n.agent_id
   OR b.op IS DISTINCT FROM n.op OR b.delegate_to IS DISTINCT FROM n.delegate_to
   OR b.hop IS DISTINCT FROM n.hop OR b.input_hash IS DISTINCT FROM hash(n.input_text)
"""
# The spans this commit stored (not the resent ones: folding a resend changes nothing; a walk
# that changes one lists it in `_changed`).
_NEW_SPAN_CHANGES_SQL = "INSERT INTO span_changes SELECT $seq, TraceId, SpanId FROM _stored"


def _first_copies(batches: list[DecodedBatch], table: pa.Table) -> pa.Table:
    """``table`` without repeated TraceId + SpanId rows (the first copy wins)."""
    joined = pc.binary_join_element_wise(table.column("TraceId"), table.column("SpanId"), "")
    if pc.count_distinct(joined).as_py() == table.num_rows:
        return table
    keys = joined.to_pylist()
    seen: set[str] = set()
    keep = []
    for index, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            keep.append(index)
    return table.take(keep)


def insert_batches(
    conn: duckdb.DuckDBPyConnection, batches: list[DecodedBatch], traces: TraceIndex | None = None
) -> int:
    """Insert the batches' rows in the caller's transaction; return rows newly stored.

    Duplicates (same TraceId + SpanId, as exporter retries send) are stored once: the first
    copy wins (this function is the only writer of `spans`, and the file has one writing
    process, so it keeps that unique without a PRIMARY KEY index). Spans without an agent take their nearest agent ancestor's, including ancestors
    stored by earlier requests and descendants stored before their ancestor arrived. With a
    ``TraceIndex`` (kept by the one writer of the file) only recent rows are read for that;
    without one the whole table is.
    """
    table = batch_to_arrow(batches)
    if table.num_rows == 0:
        return 0
    table = _first_copies(batches, table)
    conn.register("_incoming", table)
    try:
        since = traces.since([batch.table for batch in batches]) if traces is not None else None
        bound = {"since": since if since is not None else datetime.min}
        stored = conn.execute(_INSERT_NEW_SQL, bound).fetchall()
        inserted = len(stored)
        # the spans it stored: every incoming one, or (some were resent) the ones it returned
        if inserted == table.num_rows:
            conn.register("_stored", table.select(["TraceId", "SpanId"]))
        else:
            ids = (
                pa.array([row[0] for row in stored], pa.string()),
                pa.array([row[1] for row in stored], pa.string()),
            )
            conn.register("_stored", pa.table(dict(zip(("TraceId", "SpanId"), ids, strict=True))))
        tree_rows = conn.execute(_TREE_SQL, bound).fetchone()[0]
        seq = None
        if inserted:
            # The runs and origin tasks of every span of the touched traces, before the walks
            # below move spans between runs (the run a span leaves is touched too), then after.
            # every span this change lists (in span_changes) is of a touched trace, so ingested
            # at ``since`` or later; resends are not listed, so all of them are new so far (a walk
            # that changes a span stored before says otherwise, below)
            seq = next_change(
                conn,
                "spans",
                inserted,
                pc.max(table.column("ingested_at")).as_py(),
                oldest_ingested=since,
                only_new=True,  # a walk that changes a span stored before says otherwise, below
            )
            record_touched(conn, seq, "_tree")
            conn.execute(_NEW_SPAN_CHANGES_SQL, {"seq": seq})
        agentless, runless, agent_runs, agent_spans, joinable = conn.execute(_TREE_NEEDS_WORK_SQL).fetchone()
        walks = bool(agentless or runless or agent_runs or agent_spans or joinable)
        if runless:
            # first, so a nested run's caller (a tool span naming no run, as ADK's) has its run
            conn.execute(_INHERIT_RUN_SQL)
            conn.execute(_TREE_RUNS_FROM_SPANS_SQL)
        if agent_runs:
            for _ in range(8):  # one nesting level per pass
                conn.execute(_MERGE_NESTED_RUNS_SQL)
                if not conn.execute("SELECT count(*) FROM _run_merge").fetchone()[0]:
                    break
            conn.execute("DROP TABLE _run_merge")
        if agentless:
            conn.execute(_INHERIT_AGENT_SQL)
        if joinable:
            conn.execute(_JOIN_TRACE_RUN_SQL)
        if agent_spans:
            conn.execute(_AGENT_HOPS_SQL)
            conn.execute(_TOOL_RUNS_AGENT_SQL)
            conn.execute(_HANDOFF_TARGET_SQL)
            conn.execute(_AGENT_INPUT_FROM_TOOL_SQL)
            conn.execute(_AGENT_INPUT_FROM_FIRST_LLM_SQL)
        if seq is not None and (agent_runs or runless or joinable):
            touched = f"(SELECT run_id, NULL AS origin_task_id FROM spans {_TOUCHED_TRACES})"
            record_touched(conn, seq, touched, bound)
        if seq is not None and walks and tree_rows > inserted:
            # the spans the walks changed, and the (run, tool) keys they had before (the keys
            # they have now the materializer reads from the spans span_changes lists); only
            # spans stored before this commit can have changed (`_tree` holds every span of the
            # touched traces, the ones just inserted among them, so without more rows than were
            # inserted there are none)
            if conn.execute(_CHANGED_SQL).fetchone()[0]:
                conn.execute(
                    "UPDATE change_log SET only_new = false, "
                    "walks_add_only = (SELECT bool_and(added_only) FROM _changed) WHERE seq = $seq",
                    {"seq": seq},
                )
                record_run_tools(conn, seq, ["_changed"])
                conn.execute(
                    "INSERT INTO span_changes SELECT $seq, TraceId, SpanId FROM _changed", {"seq": seq}
                )
            conn.execute("DROP TABLE _changed")
        conn.execute("DROP TABLE _tree")
    finally:
        conn.unregister("_incoming")
        conn.unregister("_stored")
    return inserted


def bump_counter(conn: duckdb.DuckDBPyConnection, name: str, amount: int = 1) -> None:
    """Add ``amount`` to a persistent ingest counter."""
    conn.execute(
        "INSERT INTO ingest_counters VALUES (?, ?) "
        "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
        [name, amount],
    )


def delete_expired(conn: duckdb.DuckDBPyConnection, cutoff_ns: int, limit: int) -> int:
    """Delete up to ``limit`` spans that ended before ``cutoff_ns`` in the caller's transaction,
    logging their runs and origin tasks as touched (a deleted span changes their findings)."""
    conn.execute(
        "CREATE OR REPLACE TEMP TABLE _expired AS "
        "SELECT rowid AS rid, run_id, origin_task_id, TraceId, SpanId, ingested_at FROM spans "
        "WHERE end_ns < $cutoff LIMIT $limit",
        {"cutoff": cutoff_ns, "limit": limit},
    )
    try:
        deleted = conn.execute("DELETE FROM spans WHERE rowid IN (SELECT rid FROM _expired)").fetchall()[0][0]
        if deleted:
            ((oldest,),) = conn.execute("SELECT min(ingested_at) FROM _expired").fetchall()
            seq = next_change(conn, "delete", deleted, oldest_ingested=oldest, only_new=False)
            record_touched(conn, seq, "_expired")
            conn.execute("INSERT INTO span_changes SELECT $seq, TraceId, SpanId FROM _expired", {"seq": seq})
            # every (run, tool) group of a run that lost spans: "<run>\x1f*"
            conn.execute(
                "INSERT INTO change_partitions SELECT DISTINCT $seq, 'run_tool', run_id || chr(31) || '*' "
                "FROM _expired WHERE run_id IS NOT NULL",
                {"seq": seq},
            )
    finally:
        conn.execute("DROP TABLE _expired")
    return deleted
