-- analytics schema v6: the stored Arrow blobs of results kept by data version (0003) are gone
-- with the machinery that wrote them; findings live in the materializer's tables
-- (analytics.materialize: findings__<name>, findings_state).
DROP TABLE IF EXISTS kept_results;
