-- analytics schema v2: alert state (issue 18). The alert evaluator in `serve` writes both tables
-- through the single writer, so a restart neither loses nor repeats a notification.

-- One row per episode of an alert: a rule's finding group (a run, or an agent for rates) from the
-- evaluation that saw it over the rule's threshold until it resolved. A pending episode that never
-- fired is deleted when its group falls back under the threshold.
CREATE TABLE IF NOT EXISTS alerts (
    alert_id        VARCHAR PRIMARY KEY,          -- <rule>/<group_key>/<episode>
    rule            VARCHAR NOT NULL,
    group_key       VARCHAR NOT NULL,             -- run id (or agent) the findings share
    episode         INTEGER NOT NULL,             -- 1, 2, ... per (rule, group_key)
    alertname       VARCHAR NOT NULL,             -- the detector's name as the read API lists it
    severity        VARCHAR NOT NULL,
    labels          VARCHAR NOT NULL,             -- JSON object, fixed when the episode starts
    summary         VARCHAR NOT NULL,
    description     VARCHAR NOT NULL,
    run_id          VARCHAR,
    evidence_span   VARCHAR,                      -- a span of the newest finding (dashboard link)
    state           VARCHAR NOT NULL,             -- pending / firing / resolved
    findings        INTEGER NOT NULL,             -- findings of the group in the rule's window
    active_since    TIMESTAMP NOT NULL,           -- first evaluation over the threshold (UTC)
    starts_at       TIMESTAMP,                    -- became firing (after the rule's `for`)
    ends_at         TIMESTAMP,                    -- resolved
    last_finding_at TIMESTAMP,                    -- newest finding of the group
    updated_at      TIMESTAMP NOT NULL
);

-- What each receiver last acknowledged for an alert episode: a notification is due when the
-- episode's state differs (or, for Alertmanager, when a firing alert is due to be re-sent).
CREATE TABLE IF NOT EXISTS alert_deliveries (
    alert_id    VARCHAR NOT NULL,
    receiver    VARCHAR NOT NULL,                 -- alertmanager / webhook / slack
    sent_state  VARCHAR NOT NULL,                 -- firing / resolved
    sent_at     TIMESTAMP NOT NULL,
    PRIMARY KEY (alert_id, receiver)
);
