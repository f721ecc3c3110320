-- The finished steps of the operation running under an IN_PROGRESS claim
-- (store.Stepper): a JSON array of {"name", "at", "size", "result" or
-- "err"}, results and error bodies base64; NULL when there are none.
-- Carried by a takeover with the row's own fingerprint, cleared by
-- Complete and Fail.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS steps jsonb;
