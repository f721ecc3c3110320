package repocheck_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// productionModuleGraph returns, for every module of the workspace (named
// by its folder, the core as "idem"), the other modules its production
// packages import, as `go list` reports them.
func productionModuleGraph(t *testing.T) map[string][]string {
	t.Helper()
	pkgs := listPackages(t, repo+"/...")
	moduleOf := map[string]string{}
	for _, p := range pkgs {
		if p.Module != nil {
			moduleOf[p.ImportPath] = p.Module.Path
		}
	}
	graph := map[string][]string{}
	for _, p := range pkgs {
		if p.Module == nil || !strings.HasPrefix(p.ImportPath, repo) {
			continue
		}
		from := short(p.Module.Path)
		if _, ok := graph[from]; !ok {
			graph[from] = nil
		}
		if !production(p) {
			continue
		}
		for _, imp := range p.Imports {
			if m := moduleOf[imp]; strings.HasPrefix(imp, repo) && m != p.Module.Path && !slices.Contains(graph[from], short(m)) {
				graph[from] = append(graph[from], short(m))
			}
		}
	}
	for _, to := range graph {
		slices.Sort(to)
	}
	return graph
}

// TestModuleDiagramIsTrue holds the arrows of docs/architecture.md's module
// diagram (the Mermaid flowchart and its text version) to the production
// imports between the modules: an arrow no import draws, or an import
// with no arrow, fails.
func TestModuleDiagramIsTrue(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## Modules\n")
	if !ok {
		t.Fatal(`docs/architecture.md: no "Modules" section`)
	}
	section, _, _ = strings.Cut(section, "\n### ")
	graph := productionModuleGraph(t)
	if len(graph) < 10 {
		t.Fatalf("only %d modules listed", len(graph))
	}

	mermaid, ok := fenced(section, "mermaid")
	if !ok {
		t.Fatal("docs/architecture.md: no mermaid block under Modules")
	}
	drawn, err := mermaidArrows(mermaid)
	if err != nil {
		t.Fatalf("docs/architecture.md, mermaid: %v", err)
	}
	compareGraph(t, "the mermaid diagram", drawn, graph)

	text, ok := fenced(section, "text")
	if !ok {
		t.Fatal("docs/architecture.md: no text version of the diagram under Modules")
	}
	written, err := textArrows(text)
	if err != nil {
		t.Fatalf("docs/architecture.md, text diagram: %v", err)
	}
	compareGraph(t, "the text diagram", written, graph)
}

// compareGraph reports where the arrows a diagram draws differ from the
// real imports. Modules that import nothing of ours may be left out.
func compareGraph(t *testing.T, what string, drawn, real map[string][]string) {
	t.Helper()
	for from, to := range real {
		if len(to) == 0 {
			continue
		}
		if d := drawn[from]; !slices.Equal(d, to) {
			t.Errorf("docs/architecture.md, %s: %s → %v; its production imports reach %v", what, from, d, to)
		}
	}
	for from := range drawn {
		if _, ok := real[from]; !ok {
			t.Errorf("docs/architecture.md, %s: %s is not a module of the workspace", what, from)
		}
	}
}

// fenced returns the body of the first ```lang block of s.
func fenced(s, lang string) (string, bool) {
	_, body, ok := strings.Cut(s, "```"+lang+"\n")
	if !ok {
		return "", false
	}
	body, _, ok = strings.Cut(body, "```")
	return body, ok
}

var (
	mermaidNode = regexp.MustCompile(`(\w+)\["([^"]*)"\]`)
	mermaidTag  = regexp.MustCompile(`<[^>]*>`)
)

// mermaidArrows reads a flowchart's arrows (a --> b, a --> b & c) between
// nodes whose label starts with a module's folder (the core's with
// "<b>idem</b>").
func mermaidArrows(src string) (map[string][]string, error) {
	names := map[string]string{}
	for _, m := range mermaidNode.FindAllStringSubmatch(src, -1) {
		label, _, _ := strings.Cut(m[2], "<br/>")
		label = strings.TrimSpace(mermaidTag.ReplaceAllString(label, ""))
		label, _, _ = strings.Cut(label, " ")
		names[m[1]] = label
	}
	graph := map[string][]string{}
	for line := range strings.SplitSeq(src, "\n") {
		left, right, ok := strings.Cut(line, "-->")
		if !ok {
			continue
		}
		left = strings.TrimSpace(mermaidNode.ReplaceAllString(left, "$1"))
		from, ok := names[left]
		if !ok {
			return nil, fmt.Errorf("arrow from %q, a node with no label", left)
		}
		for id := range strings.SplitSeq(right, "&") {
			id = strings.TrimSpace(id)
			to, ok := names[id]
			if !ok {
				return nil, fmt.Errorf("arrow to %q, a node with no label", id)
			}
			if !slices.Contains(graph[from], to) {
				graph[from] = append(graph[from], to)
			}
		}
	}
	for _, to := range graph {
		slices.Sort(to)
	}
	return graph, nil
}

var (
	textColumns = regexp.MustCompile(`\s{3,}`)
	textAside   = regexp.MustCompile(`\s*\([^)]*\)`)
)

// textModule names the module of a name in the text diagram: a module's
// folder or last element, or a package of the core ("core", "idem",
// "store", "idemhttp", …); "the four stores" names four.
func textModule(name string, graph map[string][]string) []string {
	switch name {
	case "core", "idem", "store", "idemhttp", "consume", "observe", "clientkey":
		return []string{"idem"}
	case "the four stores":
		return []string{"store/boltstore", "store/dynamostore", "store/pgstore", "store/redisstore"}
	}
	if _, ok := graph[name]; ok || strings.HasPrefix(name, "store/") {
		return []string{name}
	}
	return []string{"store/" + name}
}

// textArrows reads lines of "a, b ──▶ c, d (aside)", columns apart by three
// spaces or more.
func textArrows(src string) (map[string][]string, error) {
	known := map[string][]string{}
	for _, m := range []string{"idemlambda", "idemsfn", "idemprom", "idemotel", "idempg", "idemdynamo", "idemgrpc", "idemnats", "idemamqp", "idemkafka", "idemwatermill", "examples", "bench", "cmd/idem-gateway", "cmd/idemctl"} {
		known[m] = nil
	}
	graph := map[string][]string{}
	for line := range strings.SplitSeq(src, "\n") {
		for _, entry := range textColumns.Split(strings.TrimSpace(line), -1) {
			left, right, ok := strings.Cut(entry, "──▶")
			if !ok {
				continue
			}
			var to []string
			for name := range strings.SplitSeq(textAside.ReplaceAllString(right, ""), ",") {
				for _, m := range textModule(strings.TrimSpace(name), known) {
					if !slices.Contains(to, m) {
						to = append(to, m)
					}
				}
			}
			slices.Sort(to)
			for name := range strings.SplitSeq(textAside.ReplaceAllString(left, ""), ",") {
				for _, from := range textModule(strings.TrimSpace(name), known) {
					if graph[from] != nil {
						return nil, fmt.Errorf("%s has two lines", from)
					}
					graph[from] = to
				}
			}
		}
	}
	return graph, nil
}
