-- driftscope schema v3: attributes as key/value lists, three more typed fields.
-- `SpanAttributes` / `ResourceAttributes` become STRUCT(key, value)[] (MAP before): the same
-- entries in the same order, but an insert no longer pays for MAP's duplicate-key check, which
-- was the largest single cost of storing a span (docs/performance.md). The `otel_traces` view
-- still shows them as MAPs. `guard`, `policy_current_version` and `scenario` are extracted at
-- ingest like the other coordination fields, so no detector reads the attribute lists.
-- The PRIMARY KEY (TraceId, SpanId) goes: its ART index cost half of every insert, ~60 bytes per
-- span on disk and grew in memory with the table. A span is still stored once: the single writer
-- skips spans already stored (collector/store.py, `insert_batches`), reading only the recent rows
-- of the traces it touches.
-- The table is rebuilt (column order matters to the collector's inserts); existing rows keep
-- their values, the new columns are filled from their attributes.
DROP VIEW IF EXISTS otel_traces;

CREATE TABLE spans_v3 (
    Timestamp            TIMESTAMP NOT NULL,      -- span start, UTC, microseconds
    TraceId              VARCHAR NOT NULL,        -- 32 lower-case hex chars
    SpanId               VARCHAR NOT NULL,        -- 16 lower-case hex chars
    ParentSpanId         VARCHAR NOT NULL,        -- '' for a root span
    TraceState           VARCHAR NOT NULL,
    SpanName             VARCHAR NOT NULL,
    SpanKind             VARCHAR NOT NULL,        -- Unspecified/Internal/Server/Client/Producer/Consumer
    ServiceName          VARCHAR NOT NULL,
    ResourceAttributes   STRUCT(key VARCHAR, value VARCHAR)[] NOT NULL,
    ScopeName            VARCHAR NOT NULL,
    ScopeVersion         VARCHAR NOT NULL,
    SpanAttributes       STRUCT(key VARCHAR, value VARCHAR)[] NOT NULL,
    Duration             BIGINT NOT NULL,         -- nanoseconds
    StatusCode           VARCHAR NOT NULL,        -- Unset/Ok/Error
    StatusMessage        VARCHAR NOT NULL,
    Events               VARCHAR NOT NULL,        -- JSON array [{Timestamp, Name, Attributes}]
    Links                VARCHAR NOT NULL,        -- JSON array [{TraceId, SpanId, TraceState, Attributes}]
    -- coordination fields -----------------------------------------------------------------
    start_ns             BIGINT NOT NULL,         -- exact start, ns since epoch
    end_ns               BIGINT NOT NULL,         -- exact end, ns since epoch
    span_family          VARCHAR,                 -- agent / tool / chain / llm / other (all conventions)
    operation            VARCHAR,                 -- gen_ai.operation.name
    agent_id             VARCHAR,                 -- gen_ai.agent.id (or name / openinference / traceloop)
    agent_name           VARCHAR,
    agent_source         VARCHAR,                 -- 'attribute' | 'ancestor' (inherited from an agent span)
    tool_name            VARCHAR,
    tool_call_id         VARCHAR,
    tool_args            VARCHAR,
    tool_result          VARCHAR,
    run_id               VARCHAR,                 -- gen_ai.conversation.id / session.id
    input_text           VARCHAR,                 -- input.value / traceloop.entity.input
    output_text          VARCHAR,
    graph_node_id        VARCHAR,
    graph_node_parent_id VARCHAR,
    op                   VARCHAR,                 -- driftscope.op
    state_key            VARCHAR,
    state_version        VARCHAR,
    state_expected_version VARCHAR,               -- NULL = unversioned write
    outcome              VARCHAR,                 -- ok / rejected / error
    reject_reason        VARCHAR,
    task_id              VARCHAR,
    origin_task_id       VARCHAR,
    hop                  INTEGER,
    delegate_to          VARCHAR,
    constraints_ledger   VARCHAR[],
    constraints_carried  VARCHAR[],
    constraints_waived   VARCHAR[],
    waiver_reasons       VARCHAR[],
    acceptance_constraint_ids VARCHAR[],
    goal_root            VARCHAR,
    goal_text            VARCHAR,
    objective_id         VARCHAR,
    objective_version    VARCHAR,
    objective_superseded BOOLEAN,
    policy_version       VARCHAR,
    step                 INTEGER,
    budget_max_steps     INTEGER,
    idempotency_key      VARCHAR,
    side_effect          BOOLEAN,
    guard                VARCHAR,                 -- driftscope.guard: the guard that handled the call
    policy_current_version VARCHAR,               -- driftscope.policy.current_version (stated by a refusing guard)
    scenario             VARCHAR,                 -- driftscope.scenario (simulator runs)
    ingested_at          TIMESTAMP NOT NULL
);

INSERT INTO spans_v3
SELECT Timestamp,
       TraceId,
       SpanId,
       ParentSpanId,
       TraceState,
       SpanName,
       SpanKind,
       ServiceName,
       map_entries(ResourceAttributes),
       ScopeName,
       ScopeVersion,
       map_entries(SpanAttributes),
       Duration,
       StatusCode,
       StatusMessage,
       Events,
       Links,
       start_ns,
       end_ns,
       span_family,
       operation,
       agent_id,
       agent_name,
       agent_source,
       tool_name,
       tool_call_id,
       tool_args,
       tool_result,
       run_id,
       input_text,
       output_text,
       graph_node_id,
       graph_node_parent_id,
       op,
       state_key,
       state_version,
       state_expected_version,
       outcome,
       reject_reason,
       task_id,
       origin_task_id,
       hop,
       delegate_to,
       constraints_ledger,
       constraints_carried,
       constraints_waived,
       waiver_reasons,
       acceptance_constraint_ids,
       goal_root,
       goal_text,
       objective_id,
       objective_version,
       objective_superseded,
       policy_version,
       step,
       budget_max_steps,
       idempotency_key,
       side_effect,
       SpanAttributes['driftscope.guard'],
       SpanAttributes['driftscope.policy.current_version'],
       SpanAttributes['driftscope.scenario'],
       ingested_at
FROM spans;

DROP TABLE spans;
ALTER TABLE spans_v3 RENAME TO spans;

CREATE VIEW otel_traces AS
SELECT
    Timestamp, TraceId, SpanId, ParentSpanId, TraceState, SpanName, SpanKind, ServiceName,
    map_from_entries(ResourceAttributes) AS ResourceAttributes, ScopeName, ScopeVersion,
    map_from_entries(SpanAttributes) AS SpanAttributes, Duration, StatusCode,
    StatusMessage, Events, Links
FROM spans;
