package command

import (
	"flag"
	"io"
)

func newTestFlagSet(k *keyFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	k.define(fs)
	out := outputFlag("table")
	fs.Var(&out, "o", "")
	return fs
}
