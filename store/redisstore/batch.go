package redisstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// batchMax is the most records one invocation of a batch script decides:
// a longer batch is cut into invocations of batchMax (in the same
// pipeline), so that no script holds Redis for long.
const batchMax = 128

// scripted sends a batch of writes (one(i): the arguments of the
// single-key script sc for keys[i]) as one invocation of its batch form
// bsc per node and per batchMax records (batch(i): the record's arguments
// after its key in bsc's ARGV, which starts with the number of records),
// a node's invocations in one pipeline with its WAIT when
// Config.WaitReplicas is set; by the script's SHA-1, and once more with
// its source (EVAL) on NOSCRIPT. It hands each record's reply to answer:
// the single-key script's reply (v), or the invocation's error (err), with
// the WAIT of its pipeline.
//
// On Redis Cluster the records are grouped by master (Store.groups), and
// an invocation the cluster refuses as a whole because a slot moved (a
// redirect, or a key no longer local) goes again one script per key
// through the cluster client's pipeline, which follows redirects.
func (s *Store) scripted(ctx context.Context, op string, sc, bsc *redis.Script, keys []string, errs []error, one, batch func(i int) []any, answer func(i int, v any, err error, w *redis.IntCmd)) {
	var moved []int // records to send again one by one
	run := func(g group, idx []int, source bool) (noscript []int) {
		pipe := g.pipe()
		var chunks [][]int
		for len(idx) > 0 {
			n := min(len(idx), batchMax)
			chunks, idx = append(chunks, idx[:n]), idx[n:]
		}
		cmds := make([]*redis.Cmd, len(chunks))
		for c, chunk := range chunks {
			var a []any
			for _, i := range chunk {
				ai := batch(i)
				if a == nil {
					a = make([]any, 0, 1+len(chunk)*(1+len(ai)))
					a = append(a, len(chunk))
				}
				a = append(a, s.rkey(keys[i]))
				a = append(a, ai...)
			}
			cmds[c] = scriptCmd(ctx, bsc, s.rkey(keys[chunk[0]]), a, source)
			_ = pipe.Process(ctx, cmds[c])
		}
		var w *redis.IntCmd
		if s.cfg.WaitReplicas > 0 { // on the pipeline's connection: see send
			w = s.waitCmd(ctx)
			_ = pipe.Process(ctx, w)
		}
		_, _ = pipe.Exec(ctx) // errors are per command
		for c, chunk := range chunks {
			vs, err := cmds[c].Slice()
			switch {
			case err != nil && noScript(err.Error()):
				noscript = append(noscript, chunk...)
				continue
			case err != nil && s.cluster != nil && slotMoved(err.Error()):
				moved = append(moved, chunk...)
				continue
			case err == nil && len(vs) != len(chunk):
				err = fmt.Errorf("redisstore: the batch script answered %d replies for %d records", len(vs), len(chunk))
			}
			for j, i := range chunk {
				if err != nil {
					answer(i, nil, err, w)
				} else {
					answer(i, vs[j], nil, w)
				}
			}
		}
		return noscript
	}
	for _, g := range s.groups(ctx, op, keys, errs, true) {
		// Those not executed (NOSCRIPT: Redis ran none of them, so the
		// order of the keys still holds) go again with the source, which
		// also caches the script for the next batch.
		if again := run(g, g.idx, false); len(again) > 0 {
			run(g, again, true)
		}
	}
	if len(moved) > 0 {
		s.refresh()
		sub, subErrs := make([]string, len(moved)), make([]error, len(moved))
		for j, i := range moved {
			sub[j] = keys[i]
		}
		s.pipelined(ctx, op, sub, subErrs, func(j int, source bool) *redis.Cmd {
			return scriptCmd(ctx, sc, s.rkey(sub[j]), one(moved[j]), source)
		}, nil, func(j int, cmd *redis.Cmd, w *redis.IntCmd) {
			v, err := cmd.Result()
			answer(moved[j], v, err, w)
		})
		for j, i := range moved {
			if subErrs[j] != nil {
				errs[i] = subErrs[j]
			}
		}
	}
}

// pipelined sends one command per key (cmd(i, source) for keys[i];
// source asks a script's command to carry its source rather than its
// SHA-1) in one pipeline per group (see groups), each with its WAIT when
// Config.WaitReplicas is set, sends those Redis had no script for
// (NOSCRIPT) once more with source, as a single call does (the documented
// ACL has no SCRIPT LOAD), and hands each command to answer (with the
// WAIT of its pipeline). When wrote is given (claims, which may write
// nothing: see send), a group's pipeline goes down a connection of its
// own and its WAIT follows on that connection only if wrote says one of
// its commands wrote.
func (s *Store) pipelined(ctx context.Context, op string, keys []string, errs []error, cmd func(i int, source bool) *redis.Cmd, wrote func(redis.Cmder) bool, answer func(i int, cmd *redis.Cmd, w *redis.IntCmd)) {
	run := func(g group, idx []int, source bool) (noscript []int) {
		var conn *redis.Conn
		pipe := g.pipe
		if s.cfg.WaitReplicas > 0 && wrote != nil && g.conn != nil {
			c, err := g.conn()
			if err != nil { // the node cannot be reached: each command's error
				for _, i := range idx {
					cmd := cmd(i, source)
					cmd.SetErr(err)
					answer(i, cmd, nil)
				}
				return nil
			}
			conn = c
			defer conn.Close()
			pipe = conn.Pipeline
		}
		p := pipe()
		cmds := make([]*redis.Cmd, len(idx))
		for j, i := range idx {
			cmds[j] = cmd(i, source)
			_ = p.Process(ctx, cmds[j])
		}
		var w *redis.IntCmd
		if s.cfg.WaitReplicas > 0 && conn == nil { // on the pipeline's connection: see send
			w = s.waitCmd(ctx)
			_ = p.Process(ctx, w)
		}
		_, _ = p.Exec(ctx) // errors are per command
		if conn != nil && slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return wrote(c) }) {
			w = s.waitCmd(ctx)
			_ = conn.Process(ctx, w)
		}
		for j, i := range idx {
			if err := cmds[j].Err(); err != nil && noScript(err.Error()) {
				noscript = append(noscript, i)
				continue
			}
			answer(i, cmds[j], w)
		}
		return noscript
	}
	for _, g := range s.groups(ctx, op, keys, errs, false) {
		// Those not executed (NOSCRIPT: Redis ran none of them, so the
		// order of the keys still holds) go again with the source, which
		// also caches the script for the next batch.
		if again := run(g, g.idx, false); len(again) > 0 {
			run(g, again, true)
		}
	}
}

// scriptCmd is the command that runs sc on key with args: by its SHA-1,
// or, with source, its source.
func scriptCmd(ctx context.Context, sc *redis.Script, key string, args []any, source bool) *redis.Cmd {
	a := evalArgs(sc, key, args)
	if source {
		toSource(a, sc)
	}
	return redis.NewCmd(ctx, a...)
}

// slotMoved reports whether a whole invocation was refused because a key
// is not, or no longer, served by the node it was sent to.
func slotMoved(msg string) bool {
	return strings.HasPrefix(msg, "MOVED") || strings.HasPrefix(msg, "ASK") || strings.HasPrefix(msg, "TRYAGAIN") ||
		strings.HasPrefix(msg, "CROSSSLOT") || strings.Contains(msg, "non local key")
}

// raised returns the message of an error a batch script raised for one
// record: its reply {-2, message} (complete.lua, extend.lua).
func raised(v []any) (string, bool) {
	if len(v) != 2 {
		return "", false
	}
	code, _ := v[0].(int64)
	msg, ok := v[1].(string)
	return msg, ok && code == -2
}
