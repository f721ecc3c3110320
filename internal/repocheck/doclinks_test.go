package repocheck_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/doc"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// docPackage is one package of the repository, parsed for its docs.
type docPackage struct {
	path string
	pkg  *doc.Package
}

// TestDocLinksResolve parses the doc comments of every package of every
// module in the repository, as go doc and pkg.go.dev do, and fails on a
// doc link that does not resolve: text in brackets that names a symbol
// ("[Store]", "[store.Lister]", "[Config.Wait]") but is not a link,
// because no such symbol exists or its package is not imported; and a
// link into a package of this repository whose symbol that package lacks.
func TestDocLinksResolve(t *testing.T) {
	t.Parallel()
	pkgs := parseRepoDocs(t)
	byPath := map[string]*doc.Package{}
	for _, p := range pkgs {
		byPath[p.path] = p.pkg
	}
	// Bracketed text that a reader takes for a doc link: an identifier,
	// perhaps qualified (pkg.Name, Name.Method, pkg.Name.Method), or a
	// pointer to one.
	looksLikeLink := regexp.MustCompile(`\[\*?([A-Za-z_][A-Za-z0-9_]*)(\.[A-Za-z_][A-Za-z0-9_]*){0,2}\]`)
	for _, dp := range pkgs {
		p := dp.pkg
		parser := p.Parser()
		check := func(where, text string) {
			if text == "" {
				return
			}
			d := parser.Parse(text)
			var walk func(texts []comment.Text)
			walk = func(texts []comment.Text) {
				for _, x := range texts {
					switch x := x.(type) {
					case comment.Plain:
						for _, m := range looksLikeLink.FindAllString(string(x), -1) {
							inner := strings.TrimPrefix(strings.Trim(m, "[]"), "*")
							if isKeywordish(inner) {
								continue
							}
							t.Errorf("%s: %s: doc link %s does not resolve (no such symbol, or its package is not imported here)", dp.path, where, m)
						}
					case *comment.DocLink:
						if !strings.HasPrefix(x.ImportPath, repo) {
							continue
						}
						target := byPath[x.ImportPath]
						if target == nil {
							t.Errorf("%s: %s: doc link to %s: no such package in the repository", dp.path, where, x.ImportPath)
							continue
						}
						if x.Name != "" && !hasSymbol(target, x.Recv, x.Name) {
							t.Errorf("%s: %s: doc link [%s.%s] names no symbol of %s", dp.path, where, x.ImportPath, joinSym(x.Recv, x.Name), x.ImportPath)
						}
					case *comment.Link:
						walk(x.Text)
					case comment.Italic:
					}
				}
			}
			for _, b := range d.Content {
				switch b := b.(type) {
				case *comment.Paragraph:
					walk(b.Text)
				case *comment.Heading:
					walk(b.Text)
				case *comment.List:
					for _, it := range b.Items {
						for _, c := range it.Content {
							if para, ok := c.(*comment.Paragraph); ok {
								walk(para.Text)
							}
						}
					}
				}
			}
		}
		check("package doc", p.Doc)
		forEachDoc(p, check)
	}
}

// isKeywordish reports whether bracketed text is no symbol name at all in
// prose: a single lower-case word such as "[n]" or "[i]" in an expression.
func isKeywordish(s string) bool {
	return !strings.Contains(s, ".") && len(s) <= 2
}

func joinSym(recv, name string) string {
	if recv != "" {
		return recv + "." + name
	}
	return name
}

// hasSymbol reports whether p declares name (a method of recv when recv is
// set, or a field of the struct type recv).
func hasSymbol(p *doc.Package, recv, name string) bool {
	if recv != "" {
		for _, ty := range p.Types {
			if ty.Name != recv {
				continue
			}
			for _, m := range ty.Methods {
				if m.Name == name {
					return true
				}
			}
			if st, ok := ty.Decl.Specs[0].(*ast.TypeSpec); ok {
				if s, ok := st.Type.(*ast.StructType); ok {
					for _, f := range s.Fields.List {
						for _, n := range f.Names {
							if n.Name == name {
								return true
							}
						}
					}
				}
			}
		}
		return false
	}
	for _, c := range p.Consts {
		for _, n := range c.Names {
			if n == name {
				return true
			}
		}
	}
	for _, v := range p.Vars {
		for _, n := range v.Names {
			if n == name {
				return true
			}
		}
	}
	for _, f := range p.Funcs {
		if f.Name == name {
			return true
		}
	}
	for _, ty := range p.Types {
		if ty.Name == name {
			return true
		}
		for _, c := range ty.Consts {
			if slicesContains(c.Names, name) {
				return true
			}
		}
		for _, v := range ty.Vars {
			if slicesContains(v.Names, name) {
				return true
			}
		}
		for _, f := range ty.Funcs {
			if f.Name == name {
				return true
			}
		}
	}
	return false
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// forEachDoc calls check with every declaration's doc comment in p.
func forEachDoc(p *doc.Package, check func(where, text string)) {
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			check(strings.Join(v.Names, ", "), v.Doc)
		}
	}
	funcs := func(fs []*doc.Func) {
		for _, f := range fs {
			name := f.Name
			if f.Recv != "" {
				name = strings.TrimPrefix(f.Recv, "*") + "." + f.Name
			}
			check(name, f.Doc)
		}
	}
	values(p.Consts)
	values(p.Vars)
	funcs(p.Funcs)
	for _, ty := range p.Types {
		check(ty.Name, ty.Doc)
		values(ty.Consts)
		values(ty.Vars)
		funcs(ty.Funcs)
		funcs(ty.Methods)
		// Struct fields and interface methods carry docs of their own.
		for _, spec := range ty.Decl.Specs {
			ts, ok := spec.(*ast.TypeSpec)
			if !ok {
				continue
			}
			var fields *ast.FieldList
			switch x := ts.Type.(type) {
			case *ast.StructType:
				fields = x.Fields
			case *ast.InterfaceType:
				fields = x.Methods
			}
			if fields == nil {
				continue
			}
			for _, f := range fields.List {
				if f.Doc == nil {
					continue
				}
				name := ty.Name
				if len(f.Names) > 0 {
					name += "." + f.Names[0].Name
				}
				check(name, f.Doc.Text())
			}
		}
	}
}

// parseRepoDocs parses every non-test Go file of every package of the
// repository's modules (the go.work workspace), as go doc does.
func parseRepoDocs(t *testing.T) []docPackage {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Missing(t, "go tool not on PATH")
	}
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Dir,GoFiles,Error", repo+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []docPackage
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var lp struct {
			ImportPath string
			Dir        string
			GoFiles    []string
			Error      *struct{ Err string }
		}
		if err := dec.Decode(&lp); errors.Is(err, io.EOF) {
			return pkgs
		} else if err != nil {
			t.Fatal(err)
		}
		if lp.Error != nil {
			t.Fatalf("go list %s: %s", lp.ImportPath, lp.Error.Err)
		}
		fset := token.NewFileSet()
		var files []*ast.File
		for _, name := range lp.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(lp.Dir, name), nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		p, err := doc.NewFromFiles(fset, files, lp.ImportPath)
		if err != nil {
			t.Fatalf("%s: %v", lp.ImportPath, err)
		}
		pkgs = append(pkgs, docPackage{path: lp.ImportPath, pkg: p})
	}
}
