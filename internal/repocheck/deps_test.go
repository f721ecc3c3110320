package repocheck_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/seed-a1b882c0/idem/idemtest/testenv"
)

// repo is the import path prefix of every module in this repository.
const repo = "github.com/seed-a1b882c0/idem"

// isKit reports whether p is a test kit: store/storetest, idemtest/..., a
// store module's kit (store/dynamostore/dynamotest, which the tests of the
// modules that use DynamoDB share without the core taking on the AWS SDK;
// store/redisstore/handdedup, the hand-written Redis dedup the consumers'
// benchmarks measure idem against, without the core taking on go-redis),
// a module's internal kit (internal/…test, such as idemgrpc's ordertest,
// which only that module's tests import), or a test library.
func isKit(p string) bool {
	return p == repo+"/store/storetest" || p == repo+"/store/dynamostore/dynamotest" || p == repo+"/store/redisstore/handdedup" ||
		p == repo+"/idemtest" || strings.HasPrefix(p, repo+"/idemtest/") ||
		strings.HasPrefix(p, repo+"/") && strings.Contains(p, "/internal/") && strings.HasSuffix(p, "test") ||
		strings.HasPrefix(p, "go.uber.org/goleak") || strings.HasPrefix(p, "github.com/anishathalye/porcupine")
}

type listedPackage struct {
	ImportPath string
	Standard   bool
	ForTest    string
	Module     *struct{ Path string }
	Imports    []string
	Deps       []string
	Error      *struct{ Err string }
}

// listPackages lists every package of pattern with its dependencies and
// test variants, as `go list -deps -test` sees them.
func listPackages(t *testing.T, pattern string) []listedPackage {
	t.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		testenv.Missing(t, "go tool not on PATH")
	}
	cmd := exec.Command("go", "list", "-e", "-deps", "-test",
		"-json=ImportPath,Standard,ForTest,Module,Imports,Deps,Error", pattern)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listedPackage
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listedPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			return pkgs
		} else if err != nil {
			t.Fatal(err)
		}
		if p.Error != nil {
			t.Errorf("go list %s: %s", p.ImportPath, p.Error.Err)
		}
		pkgs = append(pkgs, p)
	}
}

// production reports whether p is a non-test package of this repository
// that is not a test kit.
func production(p listedPackage) bool {
	return p.ForTest == "" && !strings.HasSuffix(p.ImportPath, ".test") &&
		(p.ImportPath == repo || strings.HasPrefix(p.ImportPath, repo+"/")) && !isKit(p.ImportPath)
}

// The core's production packages import the standard library and each
// other only; test kits (storetest, with porcupine; idemtest) stay out.
func TestProductionImportsAreStandardLibraryOnly(t *testing.T) {
	t.Parallel()
	pkgs := listPackages(t, "./...")
	std := map[string]bool{}
	for _, p := range pkgs {
		std[p.ImportPath] = p.Standard
	}
	checked := 0
	// The operator console and the manual writes it shares with idemctl
	// live in the core, so both idemctl and the gateway can serve it:
	// they must stay on the standard library too.
	// So must the consumers' verdict and the observer's vocabulary, and
	// the adapters' store keys (clientkey), which idemctl and the console
	// derive without the transports' modules.
	mustCheck := map[string]bool{repo + "/console": false, repo + "/ops": false, repo + "/consume": false, repo + "/observe": false, repo + "/clientkey": false}
	for _, p := range pkgs {
		if !production(p) || p.Module == nil || p.Module.Path != repo {
			continue
		}
		checked++
		if _, ok := mustCheck[p.ImportPath]; ok {
			mustCheck[p.ImportPath] = true
		}
		for _, d := range p.Deps {
			if !std[d] && (!strings.HasPrefix(d, repo) || isKit(d)) {
				t.Errorf("production package %s imports %s", p.ImportPath, d)
			}
		}
	}
	if checked < 3 {
		t.Fatalf("only %d production packages found in the core", checked)
	}
	for p, seen := range mustCheck {
		if !seen {
			t.Errorf("%s was not among the core's production packages checked", p)
		}
	}
}

// storeUsesEngine reports whether p is a store's package, held to the
// contract alone: every package under store/ but the conformance suite and
// storeurl (which opens stores for the commands). What joins a store to
// the engine lives in a module of its own (idempg's DoTx).
func storeUsesEngine(p string) bool {
	if !strings.HasPrefix(p, repo+"/store/") {
		return false
	}
	switch strings.TrimPrefix(p, repo+"/") {
	case "store/storetest", "store/storeurl":
		return false
	}
	return true
}

// contractOnly reports whether p is a command's package held to the store
// contract: every package under cmd/ may import package store and
// store/storeurl, no store's own package. What a command needs of a store
// comes through the contract's powers (store.Diagnoser for doctor) or
// through storeurl (Options.Logger for go-redis's lines,
// storeurl.DefaultBoltPath).
func contractOnly(p string) bool {
	return strings.HasPrefix(p, repo+"/cmd/")
}

// rpcForbidden names, for the transport-neutral packages of module
// idemgrpc, the transports they must not depend on.
var rpcForbidden = map[string][]string{
	repo + "/idemgrpc/idemrpc":     {"google.golang.org/grpc", "connectrpc.com/connect"},
	repo + "/idemgrpc/idemconnect": {"google.golang.org/grpc"},
}

// Over every module of the workspace: no production package reaches a test
// kit (they stay out of the gateway's binary and of users' builds), and no
// package, tests included, imports another module's internal packages. A
// module compiles against whatever version of the core its user selects,
// and internal packages promise nothing across versions. The
// transport-neutral packages of idemgrpc reach no transport
// (rpcForbidden).
func TestModulesKeepTheirBoundaries(t *testing.T) {
	t.Parallel()
	if gowork, err := exec.Command("go", "env", "GOWORK").Output(); err != nil || len(bytes.TrimSpace(gowork)) == 0 {
		testenv.Missing(t, "not in the repository's workspace (go.work), so the other modules cannot be listed")
	}
	if _, err := os.Stat("go.work"); err != nil {
		testenv.Missing(t, "go.work not found beside the core module: "+err.Error())
	}
	pkgs := listPackages(t, repo+"/...")
	module := map[string]string{}
	for _, p := range pkgs {
		if p.Module != nil {
			module[p.ImportPath] = p.Module.Path
		}
	}
	var modules []string
	commands := map[string]bool{} // the modules whose packages contractOnly held
	for _, p := range pkgs {
		if p.Module == nil || !strings.HasPrefix(p.ImportPath, repo) {
			continue
		}
		if !slices.Contains(modules, p.Module.Path) {
			modules = append(modules, p.Module.Path)
		}
		if production(p) {
			for _, d := range p.Deps {
				if isKit(d) {
					t.Errorf("production package %s imports test kit %s", p.ImportPath, d)
				}
			}
			// A store depends on the contract (package store) alone, never
			// on the engine, with no exception.
			if storeUsesEngine(p.ImportPath) && slices.Contains(p.Imports, repo) {
				t.Errorf("store %s imports the root package %s; a store needs package store only", p.ImportPath, repo)
			}
			// The RPC rules are transport-neutral, and a Connect user
			// never builds grpc-go: idemrpc reaches neither gRPC nor
			// Connect, idemconnect not gRPC.
			for _, d := range p.Deps {
				for _, f := range rpcForbidden[p.ImportPath] {
					if d == f || strings.HasPrefix(d, f+"/") {
						t.Errorf("%s reaches %s through %s; it must not depend on that transport", p.ImportPath, f, d)
					}
				}
			}
			// A command knows the store contract only: it opens stores
			// through storeurl and asks them through store powers
			// (store.Diagnoser for doctor), never a store package's own
			// types (contractOnly).
			if contractOnly(p.ImportPath) {
				commands[p.Module.Path] = true
				for _, imp := range p.Imports {
					if storeUsesEngine(imp) && imp != repo+"/store" {
						t.Errorf("%s imports %s; a command reaches stores through store/storeurl and the contract's powers", p.ImportPath, imp)
					}
				}
			}
			// idemotel speaks the OpenTelemetry API (metrics and traces);
			// the application picks the SDK and the exporter.
			if p.ImportPath == repo+"/idemotel" {
				for _, d := range p.Deps {
					if strings.HasPrefix(d, "go.opentelemetry.io/otel/sdk") || strings.HasPrefix(d, "go.opentelemetry.io/otel/exporters") {
						t.Errorf("idemotel imports %s; it must use the OpenTelemetry API only", d)
					}
				}
			}
		}
		for _, imp := range p.Imports {
			imp, _, _ = strings.Cut(imp, " ")      // "p [q.test]" names a test variant of p
			imp = strings.TrimSuffix(imp, "_test") // p_test is p's external test package, in p's module
			if strings.HasPrefix(imp, repo) && strings.Contains(imp+"/", "/internal/") && module[imp] != p.Module.Path {
				t.Errorf("%s (module %s) imports %s of module %s", p.ImportPath, p.Module.Path, imp, module[imp])
			}
		}
	}
	if len(modules) < 2 {
		t.Fatalf("only the modules %v were listed; expected every module of go.work", modules)
	}
	for _, m := range []string{repo + "/cmd/idem-gateway", repo + "/cmd/idemctl"} {
		if !commands[m] {
			t.Errorf("command %s was not held to the store contract (contractOnly)", m)
		}
	}
}
