package repocheck_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// identityFree reports whether the Go files of dir (a folder of the
// repository, relative to its root) may build an idem.Identity by hand:
// the root package, which defines it, and clientkey, the one path every
// adapter takes to it; test kits and the programs that show the library
// to its users (examples, bench) are no adapters.
func identityFree(dir string) bool {
	return dir == "." || dir == "clientkey" || dir == "idemtest" || strings.HasPrefix(dir, "idemtest/") ||
		dir == "store/storetest" || dir == "examples" || strings.HasPrefix(dir, "examples/") ||
		dir == "bench" || strings.HasPrefix(dir, "bench/")
}

// goFiles calls fn with every Go file of the repository (its path from the
// root, parsed), skipping testdata, hidden folders and the module cache.
func goFiles(t *testing.T, fn func(path string, fset *token.FileSet, f *ast.File)) {
	t.Helper()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		fn(filepath.ToSlash(path), fset, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// importName is the name f refers to the package path by, or "".
func importName(f *ast.File, path string) string {
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == path {
			if imp.Name != nil {
				return imp.Name.Name
			}
			return path[strings.LastIndex(path, "/")+1:]
		}
	}
	return ""
}

// Every adapter derives its store key and fingerprint through package
// clientkey (HTTPIdentity, RPCIdentity, KeyIdentity, JSONIdentity,
// PayloadIdentity), whose functions idemctl find and the console derive
// keys with: an idem.Identity an adapter filled in itself is a key no
// operator can be sure to find (idemkafka's and idemwatermill's were). The
// zero value an error return carries is no identity, and allowed.
func TestNoAdapterBuildsAnIdentity(t *testing.T) {
	t.Parallel()
	checked := 0
	goFiles(t, func(path string, fset *token.FileSet, f *ast.File) {
		if strings.HasSuffix(path, "_test.go") || identityFree(filepath.ToSlash(filepath.Dir(path))) {
			return
		}
		name := importName(f, repo)
		if name == "" {
			return
		}
		checked++
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok || len(lit.Elts) == 0 {
				return true
			}
			if sel, ok := lit.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Identity" {
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == name {
					t.Errorf("%s: an idem.Identity literal; derive it with a clientkey function (KeyIdentity, PayloadIdentity, …) so that idemctl find and the console find its record", fset.Position(lit.Pos()))
				}
			}
			return true
		})
	})
	if checked < 20 {
		t.Fatalf("only %d files importing the engine checked", checked)
	}
}

// adaptersWithoutFind are the adapter folders that make no key of their
// own, and why.
var adaptersWithoutFind = map[string]string{
	"idemprom":   "an observer: it keys no record",
	"idemotel":   "an observer: it keys no record",
	"idempg":     "runs the caller's idem.Request, keyed as idem.Do's (cmd/idemctl's TestFind finds those)",
	"idemdynamo": "runs the caller's idem.Request, keyed as idem.Do's (cmd/idemctl's TestFind finds those)",
}

// Every adapter (a folder idem… at the root but the test kits, and the
// gateway) has a find test: a record made through it is found, with the
// console or `idemctl find`, from what the client or producer sent
// (a clientkey.Material) — so a new adapter that keys its records another
// way than clientkey's table says is caught by its own test.
func TestEveryAdapterHasAFindTest(t *testing.T) {
	t.Parallel()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var adapters []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "idem") && e.Name() != "idemtest" {
			adapters = append(adapters, e.Name())
		}
	}
	adapters = append(adapters, "cmd/idem-gateway")
	found := map[string]bool{}
	goFiles(t, func(path string, _ *token.FileSet, f *ast.File) {
		if !strings.HasSuffix(path, "_test.go") {
			return
		}
		i := slices.IndexFunc(adapters, func(a string) bool { return strings.HasPrefix(path, a+"/") })
		if i < 0 {
			return
		}
		ck, console, ctl := importName(f, repo+"/clientkey"), importName(f, repo+"/idemtest/consoletest"), importName(f, repo+"/idemtest/ctltest")
		consume := importName(f, repo+"/idemtest/consumetest")
		var material, finds bool
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			x, ok := sel.X.(*ast.Ident)
			switch {
			case !ok || x.Name == "":
			case x.Name == ck && sel.Sel.Name == "Material":
				material = true
			case x.Name == console && (sel.Sel.Name == "FindIn" || sel.Sel.Name == "NewClient"),
				x.Name == ctl && sel.Sel.Name == "Find",
				x.Name == consume && sel.Sel.Name == "RecordIsFound":
				finds = true
			}
			return true
		})
		if material && finds {
			found[adapters[i]] = true
		}
	})
	for _, a := range adapters {
		why, exempt := adaptersWithoutFind[a]
		switch {
		case exempt && found[a]:
			t.Errorf("%s has a find test, but is listed as having none (%s): take it off the list", a, why)
		case !exempt && !found[a]:
			t.Errorf("%s has no find test: a test that makes a record through it and finds it with consoletest.FindIn or ctltest.Find from a clientkey.Material, or consumetest.RecordIsFound for a consumer (see idemnats/find_test.go)", a)
		}
	}
	if len(found) < 8 {
		t.Errorf("only %d adapters' find tests seen: %v", len(found), found)
	}
}
