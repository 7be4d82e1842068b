-- The OpenTelemetry Collector ClickHouse exporter's table name, as a view over `spans`, so SQL
-- written against `otel_traces` (ClickHouse dashboards, saved queries) runs here unchanged.
CREATE VIEW otel_traces AS
SELECT
    Timestamp, TraceId, SpanId, ParentSpanId, TraceState, SpanName, SpanKind, ServiceName,
    ResourceAttributes, ScopeName, ScopeVersion, SpanAttributes, Duration, StatusCode,
    StatusMessage, Events, Links
FROM spans;
