package redisstore

import (
	"errors"
	"testing"

	"github.com/seed-a1b882c0/idem/store"
)

// redisErr is an error reply, as go-redis hands it over.
type redisErr string

func (e redisErr) Error() string { return string(e) }
func (e redisErr) RedisError()   {}

// What a script meets from the server after a failover (the primary it
// talks to was demoted) is the server's state, retried as unavailable;
// only a type error, the scripts' own errors and a script that broke are
// a damaged record.
func TestErrorRepliesAreClassified(t *testing.T) {
	s := &Store{}
	for msg, corrupt := range map[string]bool{
		"READONLY You can't write against a read only replica. script: be1d3ba5, on @user_script:30.":   false,
		"LOADING Redis is loading the dataset in memory":                                                false,
		"OOM command not allowed when used memory > 'maxmemory'. script: be1d3ba5, on @user_script:30.": false,
		"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.":              false,
		"CLUSTERDOWN The cluster is down":                                                               false,
		"WRONGTYPE Operation against a key holding the wrong kind of value":                             true,
		"idem: record expiry not a number":                                                              true,
		"ERR user_script:12: Script attempted to access nonexistent global variable 'x'":                true,
	} {
		for name, err := range map[string]error{
			"translate":  s.translate("complete", "k", redisErr(msg)),
			"errorReply": s.errorReply("complete", "k", reply{kind: '-', str: msg}),
		} {
			if got := errors.Is(err, store.ErrCorrupt); got != corrupt {
				t.Errorf("%s(%q): %v, corrupt %v, want %v", name, msg, err, got, corrupt)
			}
			if !corrupt && !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("%s(%q): %v, want ErrUnavailable", name, msg, err)
			}
		}
	}
	// An ACL that refuses a command at run time needs a configuration
	// change, not a retry.
	msg := "NOPERM User app has no permissions to run the 'evalsha' command"
	for name, err := range map[string]error{
		"translate":  s.translate("complete", "k", redisErr(msg)),
		"errorReply": s.errorReply("complete", "k", reply{kind: '-', str: msg}),
	} {
		var ae *ACLError
		if !errors.As(err, &ae) || !errors.Is(err, store.ErrMisconfigured) || errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s(%q): %v, want an *ACLError matching ErrMisconfigured", name, msg, err)
		}
	}
}
