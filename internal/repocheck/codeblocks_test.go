package repocheck_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// TestMarkdownCodeBlocks compiles every ```go block of the README,
// CONTRIBUTING.md and docs/*.md, so that a renamed function breaks this
// test and not the reader.
//
// The convention (CONTRIBUTING.md, "Code in the docs"): a block is either
//
//   - a whole file, starting with its package clause;
//   - declarations (funcs, types, vars), compiled as one file; or
//   - statements, compiled as the body of a func() error.
//
// Its imports are added from the package names it uses (docImports, and
// every package of the repository by its name), and the names it uses but
// does not declare — ctx, eng, body, a Receipt type — come from
// docPlaceholders, declared at package level beside it. A variable a
// statement declares and the snippet never reads is fine: the test reads
// it. Each block becomes a package of a temporary module added to a copy
// of go.work, and one go vet run checks them all; a failure names the
// Markdown file and line. Blocks that are not Go (shell, config, output)
// take another fence language.
func TestMarkdownCodeBlocks(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Missing(t, "go tool not on PATH")
	}
	gowork, err := exec.Command("go", "env", "GOWORK").Output()
	if err != nil || len(bytes.TrimSpace(gowork)) == 0 || string(bytes.TrimSpace(gowork)) == "off" {
		testenv.Missing(t, "not in the repository's workspace (go.work): the blocks import every module")
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	imports := maps.Clone(docImports)
	for name, path := range repoPackageNames(t) {
		if _, ok := imports[name]; !ok {
			imports[name] = path
		}
	}

	tmp := t.TempDir()
	mod := filepath.Join(tmp, "docblocks")
	write := func(path, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(mod, "go.mod"), "module docblocks\n\ngo 1.26.0\n")
	write(filepath.Join(tmp, "go.work"), workspaceWith(t, string(bytes.TrimSpace(gowork)), mod))

	n := 0
	for _, f := range markdownFiles(t) {
		if _, err := os.Stat(f); err != nil {
			continue // TestMarkdownLinks reports it
		}
		for _, b := range parseMarkdown(t, f).blocks {
			if b.lang != "go" {
				continue
			}
			n++
			pkg := fmt.Sprintf("b%03d", n)
			where := filepath.Join(root, f)
			files, err := wrapBlock(pkg, where, b, imports)
			if err != nil {
				t.Errorf("%s:%d: %v", f, b.line, err)
				continue
			}
			for name, text := range files {
				write(filepath.Join(mod, pkg, name), text)
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d go blocks found; is the parser broken?", n)
	}
	if t.Failed() {
		return
	}
	cmd := exec.Command("go", "vet", "./...")
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(tmp, "go.work"), "GOFLAGS=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		// Errors name the Markdown file and line (//line directives);
		// those in the added declarations name the generated files.
		msg := strings.ReplaceAll(string(out), root+string(filepath.Separator), "")
		t.Errorf("the go blocks of the docs do not compile (%v):\n%s", err, msg)
	}
}

// docImports maps a package name a block may use to its import path:
// the standard library's and the third-party packages the docs show. The
// repository's own packages are added by name (repoPackageNames).
var docImports = map[string]string{
	"context":    "context",
	"errors":     "errors",
	"fmt":        "fmt",
	"http":       "net/http",
	"io":         "io",
	"json":       "encoding/json",
	"log":        "log",
	"os":         "os",
	"slog":       "log/slog",
	"strings":    "strings",
	"testing":    "testing",
	"time":       "time",
	"sync":       "sync",
	"otel":       "go.opentelemetry.io/otel",
	"trace":      "go.opentelemetry.io/otel/trace",
	"grpc":       "google.golang.org/grpc",
	"codes":      "google.golang.org/grpc/codes",
	"metadata":   "google.golang.org/grpc/metadata",
	"status":     "google.golang.org/grpc/status",
	"insecure":   "google.golang.org/grpc/credentials/insecure",
	"connect":    "connectrpc.com/connect",
	"amqp":       "github.com/rabbitmq/amqp091-go",
	"config":     "github.com/aws/aws-sdk-go-v2/config",
	"dynamodb":   "github.com/aws/aws-sdk-go-v2/service/dynamodb",
	"events":     "github.com/aws/aws-lambda-go/events",
	"jetstream":  "github.com/nats-io/nats.go/jetstream",
	"kgo":        "github.com/twmb/franz-go/pkg/kgo",
	"message":    "github.com/ThreeDotsLabs/watermill/message",
	"watermill":  "github.com/ThreeDotsLabs/watermill",
	"lambda":     "github.com/aws/aws-lambda-go/lambda",
	"pgx":        "github.com/jackc/pgx/v5",
	"pgxpool":    "github.com/jackc/pgx/v5/pgxpool",
	"prometheus": "github.com/prometheus/client_golang/prometheus",
	"redis":      "github.com/redis/go-redis/v9",
	"s3":         "github.com/aws/aws-sdk-go-v2/service/s3",
	"sfn":        "github.com/aws/aws-sdk-go-v2/service/sfn",
	"types":      "github.com/aws/aws-sdk-go-v2/service/dynamodb/types",
}

// docPlaceholders declares, at package level, the names the docs' blocks
// use without declaring them: the reader's own context, engine, store,
// request and domain types. A block that uses a name neither declared nor
// listed here fails, saying so.
var docPlaceholders = map[string]string{
	"ctx":              "var ctx = context.Background()",
	"subjectFrom":      "func subjectFrom(context.Context) (string, error) { return \"\", nil }",
	"authenticate":     "var authenticate grpc.UnaryServerInterceptor",
	"handler":          "var handler func(context.Context, events.KinesisEvent) (events.KinesisEventResponse, error)",
	"eng":              "var eng *idem.Engine",
	"engine":           "var engine *idem.Engine",
	"memStore":         "var memStore store.Store",
	"awsCfg":           "var awsCfg aws.Config",
	"body":             "var body []byte",
	"key":              "var key string",
	"id":               "var id string",
	"amount":           "var amount int64",
	"addr":             "var addr string",
	"mux":              "var mux = http.NewServeMux()",
	"r":                "var r *http.Request",
	"h":                "var h http.Header",
	"receipt":          "var receipt []byte",
	"smArn":            "var smArn string",
	"executionARN":     "var executionARN string",
	"jobID":            "var jobID string",
	"limit":            "var limit int",
	"ids":              "var ids []idem.Identity",
	"msgs":             "var msgs []Message",
	"t":                "var t Transfer",
	"j":                "var j job",
	"jobs":             "var jobs interface{ Enqueue(job) }",
	"job":              "type job struct {\n\tToken    string\n\tTransfer Transfer\n}",
	"Message":          "type Message struct{ Body []byte }",
	"Transfer":         "type Transfer struct {\n\tFrom, To string\n\tAmount   int64\n}",
	"Receipt":          "type Receipt struct{ ID string }",
	"ChargeReq":        "type ChargeReq struct {\n\tOrderID        string\n\tAmount         int64\n\tIdempotencyKey string\n}",
	"Order":            "type Order struct{ ID string }",
	"OrderEvent":       "type OrderEvent struct {\n\tOrderID string `json:\"order_id\"`\n\tItem    string `json:\"item\"`\n\tQty     int    `json:\"qty\"`\n}",
	"Shipment":         "type Shipment struct{ ID string }",
	"bank":             "var bank interface {\n\tCharge(context.Context, ChargeReq) (Receipt, error)\n}",
	"process":          "func process(context.Context, Message) (Receipt, error) { return Receipt{}, nil }",
	"ship":             "func ship(context.Context, []byte) (Shipment, error) { return Shipment{}, nil }",
	"createOrder":      "func createOrder(context.Context, OrderEvent) (Order, error) { return Order{}, nil }",
	"transfer":         "func transfer(context.Context, idem.Claim, Transfer) (Receipt, error) { return Receipt{}, nil }",
	"accountID":        "func accountID(*http.Request) (string, error) { return \"\", nil }",
	"accountOf":        "func accountOf(*http.Request) (string, error) { return \"\", nil }",
	"consumer":         "var consumer jetstream.Consumer",
	"js":               "var js jetstream.JetStream",
	"amqpConsumer":     "var amqpConsumer *idemamqp.Consumer",
	"confirmCh":        "var confirmCh *amqp.Channel",
	"producer":         "var producer *kgo.Client",
	"subscriber":       "var subscriber message.Subscriber",
	"consumeCh":        "var consumeCh *amqp.Channel",
	"store":            "var store = memstore.New(nil)",
	"pg":               "var pg *pgstore.Store",
	"req":              "var req ChargeReq",
	"mw":               "var mw *idemhttp.Middleware",
	"client":           "var client *dynamodb.Client",
	"opts":             "var opts *redis.ClusterOptions",
	"order":            "var order Order",
	"starter":          "var starter *idemsfn.Starter",
	"task":             "var task idemsfn.Envelope",
	"output":           "var output json.RawMessage",
	"newIsolatedStore": "func newIsolatedStore(*testing.T) store.Store { return nil }",
}

// docPlaceholderImports are the imports the placeholders need beyond
// docImports and the repository's packages.
var docPlaceholderImports = map[string]string{
	"aws": "github.com/aws/aws-sdk-go-v2/aws",
}

// repoPackageNames maps the name of every importable package of the
// repository's modules to its import path (names that two packages share
// are left out: a block that needs one is written as a whole file).
func repoPackageNames(t *testing.T) map[string]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-e", "-f", "{{.Name}} {{.ImportPath}}", repo+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	names := map[string]string{}
	dup := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, path, _ := strings.Cut(line, " ")
		if name == "main" || strings.Contains(path+"/", "/internal/") {
			continue
		}
		if _, ok := names[name]; ok {
			dup[name] = true
		}
		names[name] = path
	}
	for name := range dup {
		delete(names, name)
	}
	return names
}

// workspaceWith returns the text of the go.work at path with its relative
// directories made absolute and dir added to its use list.
func workspaceWith(t *testing.T, path, dir string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Dir(path)
	rel := regexp.MustCompile(`(?m)(^\s*|=>\s*)(\.\.?(?:/\S*)?)\s*$`)
	text := rel.ReplaceAllStringFunc(string(raw), func(m string) string {
		sub := rel.FindStringSubmatch(m)
		return sub[1] + filepath.Join(base, sub[2])
	})
	return text + "\nuse " + dir + "\n"
}

// wrapBlock turns one go block into the files of package pkg: the block
// itself, wrapped as its kind needs, with a //line directive so that
// errors name the Markdown file, and its placeholders.
func wrapBlock(pkg, mdPath string, b mdCode, imports map[string]string) (map[string]string, error) {
	directive := fmt.Sprintf("//line %s:%d\n", mdPath, b.line)
	fset := token.NewFileSet()
	// Statements may follow import declarations of their own.
	importPart, stmts, stmtLine := "", b.text, b.line
	if f, err := parser.ParseFile(fset, "", "package p\n"+b.text, parser.ImportsOnly); err == nil && len(f.Decls) > 0 {
		end := fset.Position(f.Decls[len(f.Decls)-1].End()).Offset - len("package p\n")
		importPart, stmts = directive+b.text[:end]+"\n\n", b.text[end:]
		stmtLine += strings.Count(b.text[:end], "\n")
	}
	var (
		src    string // the file, before imports and uses are added
		hasPkg bool
	)
	if regexp.MustCompile(`(?m)^package \w+`).MatchString(b.text) {
		src, hasPkg = directive+b.text, true
	} else if _, err := parser.ParseFile(fset, "", "package p\n"+b.text, parser.SkipObjectResolution); err == nil {
		head := "package " + pkg + "\n\n"
		src = head + directive + b.text + "\n"
	} else if f, err2 := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+stmts+"\n}", parser.SkipObjectResolution); err2 == nil {
		head := "package " + pkg + "\n\n" + importPart + "func _() error {\n"
		tail := "\n\treturn nil\n}\n"
		if body := f.Decls[0].(*ast.FuncDecl).Body.List; len(body) > 0 {
			if _, ok := body[len(body)-1].(*ast.ReturnStmt); ok {
				tail = "\n}\n"
			}
		}
		src = head + fmt.Sprintf("//line %s:%d\n", mdPath, stmtLine) + stmts + tail
	} else {
		return nil, fmt.Errorf("a go block must be a file, declarations or statements; as declarations: %v; as statements: %v", err, err2)
	}
	// Read every declared variable once (a snippet shows a result it does
	// not go on to use), on the line that declares it.
	f, err := parser.ParseFile(fset, "block.go", src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	type insert struct {
		at   int
		text string
	}
	var inserts []insert
	useAfter := func(list []ast.Stmt) {
		for _, s := range list {
			var names []string
			switch s := s.(type) {
			case *ast.AssignStmt:
				if s.Tok == token.DEFINE {
					for _, e := range s.Lhs {
						if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
							names = append(names, id.Name)
						}
					}
				}
			case *ast.DeclStmt:
				if g, ok := s.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
					for _, spec := range g.Specs {
						for _, id := range spec.(*ast.ValueSpec).Names {
							if id.Name != "_" {
								names = append(names, id.Name)
							}
						}
					}
				}
			}
			if len(names) > 0 {
				text := ""
				for _, n := range names {
					text += "; _ = " + n
				}
				inserts = append(inserts, insert{fset.Position(s.End()).Offset, text})
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.BlockStmt:
			useAfter(n.List)
		case *ast.CaseClause:
			useAfter(n.Body)
		case *ast.CommClause:
			useAfter(n.Body)
		}
		return true
	})
	sort.Slice(inserts, func(i, j int) bool { return inserts[i].at > inserts[j].at })
	for _, in := range inserts {
		src = src[:in.at] + in.text + src[in.at:]
	}

	files := map[string]string{}
	if hasPkg {
		files["block.go"] = src
		return files, nil
	}

	// The names the block uses and declares nowhere: packages to import,
	// placeholders to declare.
	f, err = parser.ParseFile(fset, "block.go", src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	own := map[string]bool{}
	for _, im := range f.Imports {
		name := filepath.Base(strings.Trim(im.Path.Value, `"`))
		if im.Name != nil {
			name = im.Name.Name
		}
		own[name] = true
	}
	need, placeholders, err := freeNames(f, own, imports)
	if err != nil {
		return nil, err
	}
	if len(need) > 0 {
		src = strings.Replace(src, "package "+pkg+"\n", "package "+pkg+"\n\n"+importDecl(need), 1)
	}
	files["block.go"] = src
	if len(placeholders) > 0 {
		files["placeholders.go"] = placeholderFile(pkg, placeholders, imports)
	}
	return files, nil
}

// freeNames sorts the names f uses without declaring into the import
// paths it needs and the placeholders it needs (with theirs, in turn).
func freeNames(f *ast.File, own map[string]bool, imports map[string]string) (need map[string]string, placeholders []string, err error) {
	need = map[string]string{}
	var missing []string
	seen := map[bool]map[string]bool{true: {}, false: {}} // by top
	added := map[string]bool{}                            // placeholders
	// visit sorts f's free names; in a placeholder (top false) only other
	// placeholders matter, since placeholderFile imports what they use.
	var visit func(f *ast.File, top bool)
	visit = func(f *ast.File, top bool) {
		// A name used before a dot may be a package; any other use is a
		// value or a type: a placeholder, even where a package has the
		// name (store, the package, and store, the reader's store).
		selected, valued := map[string]bool{}, map[string]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil {
					selected[id.Name] = true
					return false
				}
			}
			if id, ok := n.(*ast.Ident); ok && id.Obj == nil {
				valued[id.Name] = true
			}
			return true
		})
		for _, id := range f.Unresolved {
			name := id.Name
			if seen[top][name] || own[name] || types.Universe.Lookup(name) != nil {
				continue
			}
			seen[top][name] = true
			if _, isPkg := imports[name]; isPkg && selected[name] && !valued[name] {
				if !top {
					continue
				}
				need[name] = imports[name]
				continue
			}
			if decl, ok := docPlaceholders[name]; ok {
				if added[name] {
					continue
				}
				added[name] = true
				placeholders = append(placeholders, name)
				pf, perr := parser.ParseFile(token.NewFileSet(), "", "package p\n"+decl, 0)
				if perr != nil {
					err = fmt.Errorf("placeholder %s: %v", name, perr)
					return
				}
				visit(pf, false)
				continue
			}
			if !top {
				continue
			}
			if path, ok := imports[name]; ok {
				need[name] = path
				continue
			}
			if path, ok := docPlaceholderImports[name]; ok {
				need[name] = path
				continue
			}
			missing = append(missing, name)
		}
	}
	visit(f, true)
	if err != nil {
		return nil, nil, err
	}
	if len(missing) > 0 {
		return nil, nil, fmt.Errorf("the block uses %s, declared neither in it nor among the test's placeholders (docPlaceholders) or packages (docImports)", strings.Join(missing, ", "))
	}
	slices.Sort(placeholders)
	return need, placeholders, nil
}

func importDecl(paths map[string]string) string {
	var lines []string
	for name, path := range paths {
		if filepath.Base(path) == name {
			lines = append(lines, fmt.Sprintf("\t%q\n", path))
		} else {
			lines = append(lines, fmt.Sprintf("\t%s %q\n", name, path))
		}
	}
	slices.Sort(lines)
	return "import (\n" + strings.Join(lines, "") + ")\n\n"
}

// placeholderFile declares the placeholders names in package pkg, with
// the imports they use.
func placeholderFile(pkg string, names []string, imports map[string]string) string {
	var decls []string
	need := map[string]string{}
	for _, name := range names {
		decl := docPlaceholders[name]
		decls = append(decls, decl)
		f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+decl, 0)
		if err != nil {
			continue // freeNames reported it
		}
		selected := map[string]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil {
					selected[id.Name] = true
				}
			}
			return true
		})
		for _, id := range f.Unresolved {
			if !selected[id.Name] {
				continue // a placeholder, or a builtin
			}
			if path, ok := imports[id.Name]; ok {
				need[id.Name] = path
			} else if path, ok := docPlaceholderImports[id.Name]; ok {
				need[id.Name] = path
			}
		}
	}
	text := "package " + pkg + "\n\n"
	if len(need) > 0 {
		text += importDecl(need)
	}
	return text + strings.Join(decls, "\n\n") + "\n"
}

// The setup blocks a newcomer copies first compile as shown: they are
// whole files (package clause, imports), which TestMarkdownCodeBlocks
// compiles as they are, with no placeholder declared beside them.
func TestSetupBlocksAreWholeFiles(t *testing.T) {
	t.Parallel()
	for path, uses := range map[string]string{"docs/http.md": "idemhttp.New("} {
		found := false
		for _, b := range parseMarkdown(t, path).blocks {
			if b.lang != "go" || !strings.Contains(b.text, uses) {
				continue
			}
			found = true
			if !regexp.MustCompile(`(?m)^package \w+`).MatchString(b.text) || !strings.Contains(b.text, "\nimport (") {
				t.Errorf("%s:%d: the block with %s is not a whole file (package clause and imports): a reader cannot compile it as shown", path, b.line, uses)
			}
			break
		}
		if !found {
			t.Errorf("%s: no go block with %s", path, uses)
		}
	}
}
