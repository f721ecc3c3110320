package repocheck_test

import (
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestModuleTableIsTrue holds docs/architecture.md's table of folders to
// the repository: each folder is in the module the table says (the core,
// or a module of its own), the modules that import an own module in
// production code are the ones it names, and every module of go.work has
// a row.
func TestModuleTableIsTrue(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "### Folder by folder")
	if !ok {
		t.Fatal("docs/architecture.md: no \"Folder by folder\" section")
	}
	rows := regexp.MustCompile("(?m)^\\| (`.*?) \\| (core|own) \\| (.*?) \\|$").FindAllStringSubmatch(section, -1)
	if len(rows) < 10 {
		t.Fatalf("docs/architecture.md: only %d rows in the module table", len(rows))
	}

	pkgs := listPackages(t, repo+"/...")
	moduleOf := map[string]string{}
	for _, p := range pkgs {
		if p.Module != nil {
			moduleOf[p.ImportPath] = p.Module.Path
		}
	}
	importedBy := map[string][]string{} // module → the modules importing it in production code
	var modules []string
	for _, p := range pkgs {
		if p.Module == nil || !strings.HasPrefix(p.ImportPath, repo) {
			continue
		}
		if !slices.Contains(modules, p.Module.Path) {
			modules = append(modules, p.Module.Path)
		}
		if !production(p) {
			continue
		}
		for _, imp := range p.Imports {
			if m := moduleOf[imp]; strings.HasPrefix(imp, repo) && m != p.Module.Path && !slices.Contains(importedBy[m], short(p.Module.Path)) {
				importedBy[m] = append(importedBy[m], short(p.Module.Path))
			}
		}
	}

	listed := map[string]bool{}
	for _, row := range rows {
		folders := regexp.MustCompile("`([^`]*/|\\.)`").FindAllStringSubmatch(row[1], -1)
		for _, f := range folders {
			dir := strings.TrimSuffix(f[1], "/")
			_, statErr := os.Stat(path.Join(dir, "go.mod"))
			own := statErr == nil && dir != "."
			switch {
			case row[2] == "own" && !own:
				t.Errorf("module table: %s is said to be a module of its own, but has no go.mod", dir)
				continue
			case row[2] == "core" && own:
				t.Errorf("module table: %s is said to be in the core, but is a module of its own", dir)
				continue
			case row[2] == "core":
				if _, err := os.Stat(dir); err != nil {
					t.Errorf("module table: %s: %v", dir, err)
				}
				continue
			}
			listed[repo+"/"+dir] = true
			var want []string
			if !strings.HasPrefix(row[3], "—") {
				for _, name := range strings.Split(row[3], ", ") {
					name, _, _ = strings.Cut(name, " ")
					want = append(want, name)
				}
			}
			got := importedBy[repo+"/"+dir]
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("module table: %s is imported in production by %v; the table says %v", dir, got, want)
			}
		}
	}
	for _, m := range modules {
		if m != repo && !listed[m] {
			t.Errorf("module table: module %s has no row", m)
		}
	}
}

// short names a module by its folder.
func short(module string) string {
	if module == repo {
		return "idem"
	}
	return strings.TrimPrefix(module, repo+"/")
}
