-- The takeover policy Hold (store.Record.Hold): a claim made with it is
-- not taken over past its lease; it stays IN_PROGRESS for a person.
ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS hold boolean NOT NULL DEFAULT false;
