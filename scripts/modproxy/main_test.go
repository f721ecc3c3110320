package main

import (
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

func parse(t *testing.T, dir, text string) mod {
	t.Helper()
	f, err := modfile.Parse(dir+"/go.mod", []byte(text), nil)
	if err != nil {
		t.Fatal(err)
	}
	return mod{dir: dir, file: f}
}

func parseWork(t *testing.T, text string) *modfile.WorkFile {
	t.Helper()
	f, err := modfile.ParseWork("go.work", []byte(text), nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// work is a go.work for example.com/m and example.com/m/store, both
// replaced at v0.1.0.
const work = `go 1.26.0

use (
	.
	./store
)

replace (
	example.com/m v0.1.0 => ./
	example.com/m/store v0.1.0 => ./store
)
`

func TestCheck(t *testing.T) {
	t.Parallel()
	const core = "module example.com/m\n\ngo 1.26.0\n"
	cases := []struct {
		name    string
		store   string // go.mod of example.com/m/store
		work    string // go.work; "" for work
		want    string // the version, or "" for a refusal
		problem string // part of the refusal
	}{
		{"one version", "module example.com/m/store\n\ngo 1.26.0\n\nrequire example.com/m v0.1.0\n", "", "v0.1.0", ""},
		{"replace", "module example.com/m/store\n\ngo 1.26.0\n\nrequire example.com/m v0.1.0\n\nreplace example.com/m => ../\n", "", "", "replace example.com/m"},
		{"exclude", "module example.com/m/store\n\ngo 1.26.0\n\nrequire example.com/m v0.1.0\n\nexclude example.com/x v1.0.0\n", "", "", "exclude example.com/x"},
		{"other go directive", "module example.com/m/store\n\ngo 1.25.0\n\nrequire example.com/m v0.1.0\n", "", "", "go 1.25.0, but go.work says go 1.26.0"},
		{"placeholder version", "module example.com/m/store\n\ngo 1.26.0\n\nrequire example.com/m v0.0.0\n", "", "", "require v0.0.0 of each other"},
		{"pseudo-version", "module example.com/m/store\n\ngo 1.26.0\n\nrequire example.com/m v0.1.1-0.20260101000000-abcdefabcdef\n", "", "", "name a release"},
		{"build metadata", "module example.com/m/store\n\ngo 1.26.0\n\nrequire example.com/m v0.1.0+incompatible\n", "", "", "not a canonical semantic version"},
		{"no sibling required", "module example.com/m/store\n\ngo 1.26.0\n", "", "", "no module requires another"},
		{"go.work replaces another version", "module example.com/m/store\n\ngo 1.26.0\n\nrequire example.com/m v0.2.0\n", "", "", "go.work: replace example.com/m v0.1.0 => ./; want example.com/m v0.2.0 => ./"},
		{"go.work without a replacement", "module example.com/m/store\n\ngo 1.26.0\n\nrequire example.com/m v0.1.0\n",
			"go 1.26.0\n\nuse (\n\t.\n\t./store\n)\n\nreplace example.com/m v0.1.0 => ./\n", "", "go.work: no replace example.com/m/store v0.1.0 => ./store"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := c.work
			if w == "" {
				w = work
			}
			got, err := check([]mod{parse(t, "", core), parse(t, "store", c.store)}, parseWork(t, w))
			if c.want != "" {
				if err != nil || got != c.want {
					t.Fatalf("check = %q, %v; want %q", got, err, c.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.problem) {
				t.Fatalf("check = %q, %v; want a refusal naming %q", got, err, c.problem)
			}
		})
	}
}

func TestCheckTwoVersions(t *testing.T) {
	t.Parallel()
	mods := []mod{
		parse(t, "", "module example.com/m\n\ngo 1.26.0\n"),
		parse(t, "a", "module example.com/m/a\n\ngo 1.26.0\n\nrequire example.com/m v0.1.0\n"),
		parse(t, "b", "module example.com/m/b\n\ngo 1.26.0\n\nrequire (\n\texample.com/m v0.2.0\n\texample.com/m/a v0.2.0\n)\n"),
	}
	_, err := check(mods, parseWork(t, work))
	if err == nil {
		t.Fatal("check accepted requirements at v0.1.0 and v0.2.0")
	}
	for _, want := range []string{"version v0.1.0: example.com/m/a requires example.com/m", "version v0.2.0: example.com/m/b requires example.com/m; example.com/m/b requires example.com/m/a"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
}
