-- Whether the ancestor walks of a change only added to the spans they changed: each kept its
-- run (or had none) and its operation, and its agent (or had none), as when a parent arrives
-- after children that had no agent yet. A state kept per (run, agent) from the spans (the
-- materializer's context fold) then loses nothing the spans said before: it takes the changed
-- spans in as new ones. NULL: not known (a change logged before this column, a delete), or no
-- span stored before was changed (`only_new`).
ALTER TABLE change_log ADD COLUMN IF NOT EXISTS walks_add_only BOOLEAN;
