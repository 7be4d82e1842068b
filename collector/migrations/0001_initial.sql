-- driftscope schema v1.
-- `spans` mirrors the OpenTelemetry Collector ClickHouse exporter's `otel_traces` columns
-- (Timestamp .. Links) so the analytics SQL can move to ClickHouse; the lower-case columns after
-- them are the coordination fields extracted once at ingest (docs/semantic-conventions.md).
CREATE TABLE spans (
    Timestamp            TIMESTAMP NOT NULL,      -- span start, UTC, microseconds
    TraceId              VARCHAR NOT NULL,        -- 32 lower-case hex chars
    SpanId               VARCHAR NOT NULL,        -- 16 lower-case hex chars
    ParentSpanId         VARCHAR NOT NULL,        -- '' for a root span
    TraceState           VARCHAR NOT NULL,
    SpanName             VARCHAR NOT NULL,
    SpanKind             VARCHAR NOT NULL,        -- Unspecified/Internal/Server/Client/Producer/Consumer
    ServiceName          VARCHAR NOT NULL,
    ResourceAttributes   MAP(VARCHAR, VARCHAR) NOT NULL,
    ScopeName            VARCHAR NOT NULL,
    ScopeVersion         VARCHAR NOT NULL,
    SpanAttributes       MAP(VARCHAR, VARCHAR) NOT NULL,
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
    ingested_at          TIMESTAMP NOT NULL,
    PRIMARY KEY (TraceId, SpanId)
);

-- The analytics tables (embeddings, thresholds, goal scores) are analytics' own migrations
-- (analytics/migrations); databases created before they moved keep the tables this file made.

-- Ingest counters that survive restarts (accepted-and-discarded metrics/logs requests, etc.).
CREATE TABLE ingest_counters (
    name   VARCHAR PRIMARY KEY,
    value  BIGINT NOT NULL
);
