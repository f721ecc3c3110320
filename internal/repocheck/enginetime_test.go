package repocheck_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// TestEngineTimeIsEngineNow: outside the root package, no code reads the
// time through the engine's configuration. The engine's time (its clock
// corrected to the store's) is Engine.Now; Engine.Config returns the
// configuration as given, whose Clock is the caller's, uncorrected, so a
// Retry-After or a consumer's verdict computed from it would disagree with
// the leases the engine wrote. Config().Clock stays for waiting on it
// (.After, .AfterFunc): durations need no correction.
func TestEngineTimeIsEngineNow(t *testing.T) {
	t.Parallel()
	checked := 0
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if filepath.Dir(p) == "." || !strings.HasSuffix(p, ".go") {
			return nil // the root package is the engine
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			return nil
		}
		checked++
		for _, pos := range configClockReads(f) {
			t.Errorf("%s: reads the engine's clock through Config(); read the engine's time with Engine.Now (Config().Clock is the caller's clock, uncorrected: only wait on it)", fset.Position(pos))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("only %d Go files outside the root package were checked", checked)
	}
}

// configClockReads returns where f reads Clock from the result of a
// Config() call, directly (x.Config().Clock) or through a variable
// (c := x.Config(); c.Clock), other than to wait on it (.After, .AfterFunc).
func configClockReads(f *ast.File) []token.Pos {
	waits := map[ast.Expr]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "After" || sel.Sel.Name == "AfterFunc") {
				waits[sel.X] = true
			}
		}
		return true
	})
	var at []token.Pos
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Clock" || waits[sel] {
			return true
		}
		if isConfigCall(sel.X) || isConfigVar(sel.X) {
			at = append(at, sel.Pos())
		}
		return true
	})
	return at
}

// isConfigCall reports whether e is a call x.Config() without arguments.
func isConfigCall(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok || len(call.Args) != 0 {
		return false
	}
	fn, ok := call.Fun.(*ast.SelectorExpr)
	return ok && fn.Sel.Name == "Config"
}

// isConfigVar reports whether e is a variable declared from a Config()
// call (c := x.Config(), var c = x.Config()).
func isConfigVar(e ast.Expr) bool {
	id, ok := e.(*ast.Ident)
	if !ok || id.Obj == nil {
		return false
	}
	switch d := id.Obj.Decl.(type) {
	case *ast.AssignStmt:
		for i, l := range d.Lhs {
			if l, ok := l.(*ast.Ident); ok && l.Name == id.Name && len(d.Rhs) == len(d.Lhs) {
				return isConfigCall(d.Rhs[i])
			}
		}
	case *ast.ValueSpec:
		for i, n := range d.Names {
			if n.Name == id.Name && len(d.Values) == len(d.Names) {
				return isConfigCall(d.Values[i])
			}
		}
	}
	return false
}

// The rule's check finds each way of reading the engine's clock through
// its configuration, and lets waiting on it and other Configs' fields be.
func TestConfigClockReadsFindsEachForm(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		body string
		want int
	}{
		"Config().Clock.Now()":    {"_ = e.Config().Clock.Now()", 1},
		"clock taken":             {"clock := e.Config().Clock\n_ = clock.Now()", 1},
		"config copied":           {"ec := e.Config()\n_ = ec.Clock.Now()", 1},
		"var config":              {"var ec = e.Config()\n_ = ec.Clock", 1},
		"clock passed on":         {"consume.Collect(in, 1, 0, e.Config().Clock)", 1},
		"wait on After":           {"<-e.Config().Clock.After(time.Second)", 0},
		"wait on AfterFunc":       {"e.Config().Clock.AfterFunc(time.Second, f)", 0},
		"Engine.Now":              {"_ = e.Now()", 0},
		"another field":           {"_ = e.Config().Lease", 0},
		"a Clock not from Config": {"_ = cfg.Clock.Now()", 0},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f, err := parser.ParseFile(token.NewFileSet(), "x.go", "package x\nfunc _() {\n"+tc.body+"\n}\n", 0)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(configClockReads(f)); got != tc.want {
				t.Fatalf("%d reads found in %q, want %d", got, tc.body, tc.want)
			}
		})
	}
}
