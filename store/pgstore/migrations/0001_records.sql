-- idem records. {{.Table}} is the configured table name, quoted;
-- index_name makes an index name from the table name.
CREATE TABLE IF NOT EXISTS {{.Table}} (
	key          text     PRIMARY KEY,
	status       smallint NOT NULL CHECK (status BETWEEN 1 AND 3),
	fence        bigint   NOT NULL CHECK (fence >= 1),
	owner        text     NOT NULL,
	lease_until  bigint   NOT NULL,
	expires_at   bigint   NOT NULL,
	fingerprint  text     NOT NULL,
	result       bytea,
	err_code     text,
	err_message  text,
	err_body     bytea,
	ref          text,
	created_at   bigint   NOT NULL,
	completed_at bigint,
	version      integer  NOT NULL,
	-- set by a claim: whether it replaced a live record past its lease
	takeover     boolean  NOT NULL DEFAULT false
);
-- "by status" and "stuck past lease" listings, and the reaper.
CREATE INDEX IF NOT EXISTS {{index_name "status_lease"}} ON {{.Table}} (status, lease_until);
CREATE INDEX IF NOT EXISTS {{index_name "expires"}} ON {{.Table}} (expires_at);
