package repocheck_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestFuzzTargetsAreListed holds the Makefile's FUZZ_TARGETS to every fuzz
// function in the repository, so `make fuzz` runs each one and a new fuzzer
// cannot be forgotten there.
func TestFuzzTargetsAreListed(t *testing.T) {
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^FUZZ_TARGETS\s*:=\s*(.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no FUZZ_TARGETS line")
	}
	listed := strings.Fields(string(m[1]))

	var found []string
	fset := token.NewFileSet()
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && isFuzz(fn) {
				found = append(found, filepath.ToSlash(filepath.Dir(path))+":"+fn.Name.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("no fuzz function found; the walk is broken")
	}
	for _, f := range found {
		if !slices.Contains(listed, f) {
			t.Errorf("fuzz target %s is not in the Makefile's FUZZ_TARGETS", f)
		}
	}
	for _, l := range listed {
		if !slices.Contains(found, l) {
			t.Errorf("FUZZ_TARGETS lists %s, which is no fuzz function", l)
		}
	}
}

// isFuzz reports whether fn is a fuzz test: FuzzXxx(f *testing.F).
func isFuzz(fn *ast.FuncDecl) bool {
	if !strings.HasPrefix(fn.Name.Name, "Fuzz") || fn.Type.Params.NumFields() != 1 {
		return false
	}
	star, ok := fn.Type.Params.List[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "F"
}
