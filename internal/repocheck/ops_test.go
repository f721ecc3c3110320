package repocheck_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The files under ops/ are data for Prometheus and Grafana; promtool checks
// and unit-tests the rules (make ops-check). These tests keep the Grafana
// dashboard importable and every metric it shows and every alert the rules
// raise documented in docs/operations.md.

const operationsDoc = "docs/operations.md"

// metricName finds the idem metric names an expression uses; recording
// rules' names (job:idem_...) are not metrics.
var metricName = regexp.MustCompile(`(?:^|[^A-Za-z0-9_:])(idem_[A-Za-z0-9_]+)`)

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDashboard(t *testing.T) {
	t.Parallel()
	type datasource struct{ Type, UID string }
	var dash struct {
		SchemaVersion int `json:"schemaVersion"`
		Templating    struct {
			List []struct {
				Name, Type string
				Query      json.RawMessage
			}
		}
		Panels []struct {
			ID         int
			Type       string
			Title      string
			Datasource *datasource
			Targets    []struct{ Expr string }
		}
	}
	if err := json.Unmarshal([]byte(readFile(t, "ops/grafana/idem-dashboard.json")), &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	doc := readFile(t, operationsDoc)
	var exprs []string

	if dash.SchemaVersion < 36 {
		t.Errorf("schemaVersion is %d; Grafana 9 and later expect at least 36", dash.SchemaVersion)
	}
	hasDatasource := false
	for _, v := range dash.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" && string(v.Query) == `"prometheus"` {
			hasDatasource = true
		}
		if v.Type == "query" {
			var q struct{ Query string }
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable %s: query is not {\"query\": ...}: %v", v.Name, err)
			}
			exprs = append(exprs, q.Query)
		}
	}
	if !hasDatasource {
		t.Error(`no variable "datasource" of type datasource for Prometheus: the dashboard would be tied to one data source`)
	}

	ids := map[int]bool{}
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d is used twice", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v; want the $datasource variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q has a target without an expression", p.Title)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	if len(ids) < 10 {
		t.Errorf("only %d panels", len(ids))
	}

	for _, e := range exprs {
		for _, m := range metricName.FindAllStringSubmatch(e, -1) {
			name := m[1]
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if base, ok := strings.CutSuffix(name, suffix); ok && strings.Contains(doc, "`"+base+"`") {
					name = base
				}
			}
			if !strings.Contains(doc, "`"+name+"`") {
				t.Errorf("the dashboard uses %s, which %s does not list: %s", name, operationsDoc, e)
			}
		}
	}
}

// Every alert links to its runbook section, a heading named after it.
func TestAlertsHaveRunbooks(t *testing.T) {
	t.Parallel()
	rules := readFile(t, "ops/prometheus/idem-rules.yml")
	doc := readFile(t, operationsDoc)
	blocks := strings.Split(rules, "- alert: ")[1:]
	if len(blocks) < 9 {
		t.Fatalf("found %d alerts in the rules, want at least 9", len(blocks))
	}
	for _, b := range blocks {
		name, _, _ := strings.Cut(b, "\n")
		name = strings.TrimSpace(name)
		if want := operationsDoc + "#" + strings.ToLower(name); !strings.Contains(b, "runbook_url: '") || !strings.Contains(b, want+"'") {
			t.Errorf("alert %s: no runbook_url ending in %s", name, want)
		}
		if !strings.Contains(doc, "\n### "+name+"\n") {
			t.Errorf("alert %s: %s has no section ### %s", name, operationsDoc, name)
		}
	}
}
