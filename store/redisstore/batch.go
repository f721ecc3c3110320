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

// scripted sends a batch of writes (the single-key script whose batch form
// is bsc, with args(i) — width arguments — on keys[i]) as one invocation
// of bsc per node and per batchMax records, a node's invocations in one
// pipeline with its WAIT when Config.WaitReplicas is set; by the script's
// SHA-1, and once more with its source (EVAL) on NOSCRIPT. It hands each
// record's reply to answer: the single-key script's reply (v), or the
// invocation's error (err), with the WAIT of its pipeline.
//
// On Redis Cluster the records are grouped by master (Store.groups), and
// an invocation the cluster refuses as a whole because a slot moved (a
// redirect, or a key no longer local) goes again one script per key
// through the cluster client's pipeline, which follows redirects.
func (s *Store) scripted(ctx context.Context, op string, sc, bsc *redis.Script, keys []string, errs []error, width int, args func(i int) []any, wrote func(v any) bool, answer func(i int, v any, err error, w *redis.IntCmd)) {
	var moved []int // records to send again one by one
	run := func(g group, idx []int, source bool) (noscript []int) {
		// With wrote (claims) and WaitReplicas, the invocations go on a
		// connection of their own and WAIT follows only if a record was
		// written: a batch of replays waits for no replica (see send).
		var conn *redis.Conn
		pipe := g.pipe()
		if s.cfg.WaitReplicas > 0 && wrote != nil && g.conn != nil {
			conn = g.conn()
			defer conn.Close()
			pipe = conn.Pipeline()
		}
		var chunks [][]int
		for len(idx) > 0 {
			n := min(len(idx), batchMax)
			chunks, idx = append(chunks, idx[:n]), idx[n:]
		}
		cmds := make([]*redis.Cmd, len(chunks))
		for c, chunk := range chunks {
			a := make([]any, 0, 2+len(chunk)*(1+width))
			a = append(a, len(chunk), width)
			for _, i := range chunk {
				a = append(a, s.rkey(keys[i]))
				a = append(a, args(i)...)
			}
			first := []string{s.rkey(keys[chunk[0]])}
			if source {
				cmds[c] = pipe.Eval(ctx, scriptSources[bsc], first, a...)
			} else {
				cmds[c] = bsc.EvalSha(ctx, pipe, first, a...)
			}
		}
		var w *redis.IntCmd
		if s.cfg.WaitReplicas > 0 && conn == nil { // on the pipeline's connection: see send
			w = s.waitCmd(ctx)
			_ = pipe.Process(ctx, w)
		}
		_, _ = pipe.Exec(ctx) // errors are per command
		type reply struct {
			chunk []int
			vs    []any
			err   error
		}
		replies := make([]reply, 0, len(chunks))
		written := false
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
			if err == nil && conn != nil && !written {
				written = slices.ContainsFunc(vs, wrote)
			}
			replies = append(replies, reply{chunk, vs, err})
		}
		if written {
			w = s.waitCmd(ctx)
			_ = conn.Process(ctx, w)
		}
		for _, r := range replies {
			for j, i := range r.chunk {
				if r.err != nil {
					answer(i, nil, r.err, w)
				} else {
					answer(i, r.vs[j], nil, w)
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
		var wroteCmd func(*redis.Cmd) bool
		if wrote != nil {
			wroteCmd = func(c *redis.Cmd) bool { v, err := c.Result(); return err == nil && wrote(v) }
		}
		s.batch(ctx, op, sc, sub, subErrs, func(j int) []any { return args(moved[j]) }, wroteCmd, func(j int, cmd *redis.Cmd, w *redis.IntCmd) {
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

// slotMoved reports whether a whole invocation was refused because a key
// is not, or no longer, served by the node it was sent to.
func slotMoved(msg string) bool {
	return strings.HasPrefix(msg, "MOVED") || strings.HasPrefix(msg, "ASK") || strings.HasPrefix(msg, "TRYAGAIN") ||
		strings.HasPrefix(msg, "CROSSSLOT") || strings.Contains(msg, "non local key")
}

// raised returns the message of an error a batch script raised for one
// record: its reply {-2, message} (batch.lua).
func raised(v []any) (string, bool) {
	if len(v) != 2 {
		return "", false
	}
	code, _ := v[0].(int64)
	msg, ok := v[1].(string)
	return msg, ok && code == -2
}
