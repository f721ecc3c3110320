package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/seed-a1b882c0/idem/store"
)

// PrivilegeError reports that the role the store connects as lacks a
// privilege the store needs: on the records table (SELECT, INSERT, UPDATE,
// DELETE), or, while migrating, on the schema or idem_schema_migrations.
// It matches store.ErrInvalidConfig and store.ErrMisconfigured (errors.Is):
// no retry mends it, a GRANT does.
type PrivilegeError struct {
	// Role is the role connected (current_user), when known.
	Role string
	// Table is the records table, as configured.
	Table string
	// Missing lists the table privileges found missing by [Store.Check];
	// empty when the server refused a statement (Err).
	Missing []string
	// Migrating is set when the refusal came while migrating.
	Migrating bool
	// Err is the server's refusal (SQLSTATE 42501), if any.
	Err error
}

func (e *PrivilegeError) Error() string {
	who, role := "the store's role", "ROLE"
	if e.Role != "" {
		who, role = "role "+e.Role, e.Role
	}
	grant := fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s", e.Table, role)
	switch {
	case len(e.Missing) > 0:
		return fmt.Sprintf("pgstore: %s lacks %s on table %s: as the table's owner, run %s",
			who, strings.Join(e.Missing, ", "), e.Table, grant)
	case e.Migrating:
		return fmt.Sprintf("pgstore: %s may not migrate table %s (%v): run the migrations as the table's owner "+
			"(idemctl migrate, or pgstore.Migrate), then %s, and GRANT USAGE on its schema and SELECT on its idem_schema_migrations to %s",
			who, e.Table, e.Err, grant, role)
	}
	return fmt.Sprintf("pgstore: %s was refused on table %s (%v): as the table's owner, run %s", who, e.Table, e.Err, grant)
}

// Is makes errors.Is(err, store.ErrInvalidConfig) and
// errors.Is(err, store.ErrMisconfigured) true.
func (e *PrivilegeError) Is(target error) bool {
	return target == store.ErrInvalidConfig || target == store.ErrMisconfigured
}

func (e *PrivilegeError) Unwrap() error { return e.Err }

// insufficientPrivilege reports the server's SQLSTATE 42501.
func insufficientPrivilege(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42501"
}

// Check checks that the table exists and that the role the store connects
// as holds SELECT, INSERT, UPDATE and DELETE on it: a [*PrivilegeError]
// names the privileges missing and the GRANT that adds them. A missing
// table is a [*NoTableError] and an unreachable server
// store.ErrUnavailable, as for any call.
// [Open] calls it, and so does storeurl.Open.
func (s *Store) Check(ctx context.Context) error {
	var role string
	var has [4]bool
	privs := [4]string{"SELECT", "INSERT", "UPDATE", "DELETE"}
	err := s.db.QueryRow(ctx, "SELECT current_user, has_table_privilege($1, 'SELECT'), has_table_privilege($1, 'INSERT'), "+
		"has_table_privilege($1, 'UPDATE'), has_table_privilege($1, 'DELETE')", s.table).Scan(&role, &has[0], &has[1], &has[2], &has[3])
	if err != nil {
		return s.translate("check", "", err)
	}
	var missing []string
	for i, ok := range has {
		if !ok {
			missing = append(missing, privs[i])
		}
	}
	if len(missing) > 0 {
		return &PrivilegeError{Role: role, Table: s.cfg.Table, Missing: missing}
	}
	return nil
}

// ConnectError reports that PostgreSQL refused the store's connection for
// a reason no retry mends: the password was refused (SQLSTATE 28P01), no
// pg_hba.conf entry admits the role, or the role does not exist (28000), or
// the database does not exist (3D000). It matches store.ErrInvalidConfig
// and store.ErrMisconfigured (errors.Is), so storeurl.OpenWait fails at
// once instead of waiting out its -store-wait; the message says what to
// fix. A server that refuses for a while (too many connections, 53300;
// starting up or shutting down, 57P03) is store.ErrUnavailable instead.
type ConnectError struct {
	// Code is the server's SQLSTATE; User and Database what the store
	// connected as and to, as the server reported them when it did.
	Code           string
	User, Database string
	// Err is the server's refusal.
	Err error
}

func (e *ConnectError) Error() string {
	var fix string
	switch e.Code {
	case "28P01":
		fix = "the password in the store's URL is wrong for role " + orUnknown(e.User) + ": correct it (or the role's password: ALTER ROLE ... PASSWORD)"
	case "3D000":
		fix = "database " + orUnknown(e.Database) + " does not exist: create it (CREATE DATABASE) or name an existing one in the store's URL"
	default: // 28000
		fix = "the server does not admit role " + orUnknown(e.User) + " to database " + orUnknown(e.Database) +
			": create the role (CREATE ROLE ... LOGIN), or add a pg_hba.conf entry for it and reload the server"
	}
	return fmt.Sprintf("pgstore: connection refused (SQLSTATE %s): %s (%v)", e.Code, fix, e.Err)
}

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}

// Is makes errors.Is(err, store.ErrInvalidConfig) and
// errors.Is(err, store.ErrMisconfigured) true.
func (e *ConnectError) Is(target error) bool {
	return target == store.ErrInvalidConfig || target == store.ErrMisconfigured
}

func (e *ConnectError) Unwrap() error { return e.Err }

// connectRefused returns a [*ConnectError] when err is the server refusing
// the connection for good (see ConnectError), else nil.
func connectRefused(err error) *ConnectError {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return nil
	}
	switch pe.Code {
	case "28P01", "28000", "3D000":
	default:
		return nil
	}
	ce := &ConnectError{Code: pe.Code, Err: pe}
	var cerr *pgconn.ConnectError
	if errors.As(err, &cerr) && cerr.Config != nil {
		ce.User, ce.Database = cerr.Config.User, cerr.Config.Database
	}
	return ce
}

// NoTableError reports that the records table does not exist: the
// migrations have not run on this database (or the URL names another
// table). It matches store.ErrUnavailable (errors.Is), as for any call
// that cannot reach its data: a program that starts while its migrations
// still run waits for them (storeurl.OpenWait); and the message and
// [NoTableError.Fix] say to run idemctl migrate.
type NoTableError struct {
	// Op and Key are the call that found it ("ping", "claim", …).
	Op, Key string
	// Table is the records table, as configured.
	Table string
	// Err is the server's error (SQLSTATE 42P01).
	Err error
}

func (e *NoTableError) Error() string {
	return fmt.Sprintf("pgstore: %s %s: table %s does not exist: %s (%v)", e.Op, e.Key, e.Table, e.Fix(), e.Err)
}

// Fix implements store.Fixer: what creates the table.
func (e *NoTableError) Fix() string {
	return "create it with idemctl migrate on this store's URL (or pgstore.Migrate), as a role that may create tables in its schema; " +
		"or name the existing table with table= (Config.Table)"
}

// Is makes errors.Is(err, store.ErrUnavailable) true.
func (e *NoTableError) Is(target error) bool { return target == store.ErrUnavailable }

func (e *NoTableError) Unwrap() error { return e.Err }

// Durability is what the server says of how long a commit it
// acknowledged lasts: through a crash of the server, and through a
// failover to a standby. See [Store.Durability].
type Durability struct {
	// SynchronousCommit is synchronous_commit as the store's sessions
	// have it (on, remote_apply, remote_write, local or off): off lets a
	// crash of the server lose the last commits it acknowledged.
	SynchronousCommit string
	// SynchronousStandbyNames is synchronous_standby_names: empty means a
	// commit waits for no standby, so a failover can lose the last commits
	// acknowledged.
	SynchronousStandbyNames string
	// Standbys counts the standbys streaming from the server
	// (pg_stat_replication; a role that may not read it sees its own only).
	Standbys int
	// InRecovery is true when the server is a standby: writes fail.
	InRecovery bool
}

// Durability reads the server's settings that decide whether an
// acknowledged outcome survives a crash or a failover (docs/production.md):
// one read-only query, for [Store.Diagnose].
func (s *Store) Durability(ctx context.Context) (Durability, error) {
	var d Durability
	err := s.db.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('synchronous_standby_names'), "+
		"(SELECT count(*) FROM pg_stat_replication)::int, pg_is_in_recovery()").Scan(&d.SynchronousCommit, &d.SynchronousStandbyNames, &d.Standbys, &d.InRecovery)
	return d, s.translate("durability", "", err)
}
