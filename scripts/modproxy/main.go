// Command modproxy writes the repository's modules into a file-system
// module proxy, as a release would publish them, so that the go command
// can fetch them the way a user does (GOPROXY=file://DIR):
//
//	go run ./scripts/modproxy DIR
//
// Every module of go.work except the repository's tooling under scripts/
// is written at the one version the modules require of each other (the
// next release; see docs/releases.md):
// DIR/<module path, case-encoded>/@v/{list,VERSION.info,VERSION.mod,VERSION.zip}.
// The zips hold the working tree's files that git tracks or would track
// (ignored files left out), so uncommitted changes are checked too.
//
// It refuses, naming each problem, a go.mod with a replace directive (go
// install refuses them), a go directive other than go.work's, and
// requirements of sibling modules that name different versions. It prints
// the version.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

func main() {
	if len(os.Args) != 2 || strings.HasPrefix(os.Args[1], "-") {
		fmt.Fprintln(os.Stderr, "usage: go run ./scripts/modproxy DIR   (run at the repository root)")
		os.Exit(2)
	}
	version, err := run(".", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "modproxy:", err)
		os.Exit(1)
	}
	fmt.Println(version)
}

// mod is one module of the workspace.
type mod struct {
	dir  string // slash-separated, relative to the repository root; "" for the root
	file *modfile.File
}

func (m mod) path() string { return m.file.Module.Mod.Path }

func run(root, out string) (string, error) {
	mods, work, err := workspace(root)
	if err != nil {
		return "", err
	}
	version, err := check(mods, work)
	if err != nil {
		return "", err
	}
	files, err := repoFiles(root)
	if err != nil {
		return "", err
	}
	info, err := infoJSON(root, version)
	if err != nil {
		return "", err
	}
	for _, m := range mods {
		if err := write(root, out, m, version, info, files); err != nil {
			return "", fmt.Errorf("%s: %w", m.path(), err)
		}
	}
	return version, nil
}

// workspace reads go.work and the go.mod of every module it uses, leaving
// out the tooling under scripts/, which is never published.
func workspace(root string) ([]mod, *modfile.WorkFile, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		return nil, nil, err
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, nil, err
	}
	var mods []mod
	for _, u := range work.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		if dir == "." {
			dir = ""
		}
		if dir == "scripts" || strings.HasPrefix(dir, "scripts/") {
			continue
		}
		name := path.Join(dir, "go.mod")
		data, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(name)))
		if err != nil {
			return nil, nil, err
		}
		f, err := modfile.Parse(name, data, nil)
		if err != nil {
			return nil, nil, err
		}
		if f.Module == nil {
			return nil, nil, fmt.Errorf("%s has no module directive", name)
		}
		mods = append(mods, mod{dir: dir, file: f})
	}
	return mods, work, nil
}

// check returns the version the modules require of each other, or every
// reason they are not fit to publish or go.work does not match them.
func check(mods []mod, work *modfile.WorkFile) (string, error) {
	if work.Go == nil {
		return "", errors.New("go.work has no go directive")
	}
	goVersion := work.Go.Version
	paths := map[string]bool{}
	for _, m := range mods {
		paths[m.path()] = true
	}
	var problems []string
	versions := map[string][]string{} // version → "module requires sibling"
	for _, m := range mods {
		f := m.file
		name := path.Join(m.dir, "go.mod")
		for _, r := range f.Replace {
			problems = append(problems, fmt.Sprintf("%s: replace %s: development uses go.work; go install refuses a module with replace directives", name, r.Old.Path))
		}
		for _, x := range f.Exclude {
			problems = append(problems, fmt.Sprintf("%s: exclude %s: go install refuses a module with exclude directives", name, x.Mod.Path))
		}
		if f.Go == nil || f.Go.Version != goVersion {
			got := "none"
			if f.Go != nil {
				got = f.Go.Version
			}
			problems = append(problems, fmt.Sprintf("%s: go %s, but go.work says go %s; every module says the same", name, got, goVersion))
		}
		for _, r := range f.Require {
			if paths[r.Mod.Path] {
				versions[r.Mod.Version] = append(versions[r.Mod.Version], m.path()+" requires "+r.Mod.Path)
			}
		}
	}
	var found []string
	for v := range versions {
		found = append(found, v)
	}
	slices.Sort(found)
	switch {
	case len(found) == 0:
		problems = append(problems, "no module requires another, so there is no version to publish")
	case len(found) > 1:
		for _, v := range found {
			problems = append(problems, fmt.Sprintf("version %s: %s", v, strings.Join(versions[v], "; ")))
		}
		problems = append(problems, "the modules must require each other at one version, the next release")
	case !semver.IsValid(found[0]) || semver.Canonical(found[0]) != found[0] || semver.Build(found[0]) != "":
		problems = append(problems, fmt.Sprintf("the modules require %s of each other; that is not a canonical semantic version", found[0]))
	case found[0] == "v0.0.0" || module.IsPseudoVersion(found[0]):
		problems = append(problems, fmt.Sprintf("the modules require %s of each other; name a release", found[0]))
	default:
		problems = append(problems, replacements(mods, work, found[0])...)
	}
	if len(problems) > 0 {
		return "", errors.New(strings.Join(problems, "\n\t"))
	}
	return found[0], nil
}

// replacements checks that go.work replaces every module at version with
// its own directory, and nothing else of the repository.
func replacements(mods []mod, work *modfile.WorkFile, version string) []string {
	var problems []string
	want := map[string]string{} // module path → directory, as go.work writes it
	for _, m := range mods {
		want[m.path()] = "./" + m.dir
	}
	seen := map[string]bool{}
	for _, r := range work.Replace {
		dir, ok := want[r.Old.Path]
		if !ok {
			continue
		}
		seen[r.Old.Path] = true
		if r.Old.Version != version || r.New.Version != "" || path.Clean(r.New.Path) != path.Clean(dir) {
			problems = append(problems, fmt.Sprintf("go.work: replace %s %s => %s; want %s %s => %s", r.Old.Path, r.Old.Version, r.New.Path, r.Old.Path, version, dir))
		}
	}
	for _, m := range mods {
		if !seen[m.path()] {
			problems = append(problems, fmt.Sprintf("go.work: no replace %s %s => %s: workspace builds would fetch that version's go.mod from the module proxy", m.path(), version, want[m.path()]))
		}
	}
	return problems
}

// repoFiles lists the working tree's files that git tracks or would track,
// slash-separated, relative to root.
func repoFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f))); errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree
		}
		files = append(files, f)
	}
	slices.Sort(files)
	files = slices.Compact(files)
	return files, nil
}

// infoJSON is the .info of every module: the version and the time of the
// commit checked out.
func infoJSON(root, version string) ([]byte, error) {
	cmd := exec.Command("git", "log", "-1", "--format=%cI")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git log: %w", err)
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(out)))
	if err != nil {
		return nil, err
	}
	return json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, t.UTC()})
}

// write adds module m at version to the proxy in out.
func write(root, out string, m mod, version string, info []byte, files []string) error {
	escaped, err := module.EscapePath(m.path())
	if err != nil {
		return err
	}
	dir := filepath.Join(out, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var zfiles []modzip.File
	haveLicense := false
	prefix := ""
	if m.dir != "" {
		prefix = m.dir + "/"
	}
	for _, f := range files {
		rel, ok := strings.CutPrefix(f, prefix)
		if !ok {
			continue
		}
		haveLicense = haveLicense || rel == "LICENSE"
		zfiles = append(zfiles, repoFile{root: root, name: f, rel: rel})
	}
	if !haveLicense && m.dir != "" && slices.Contains(files, "LICENSE") {
		// As the go command does when it zips a module in a subdirectory
		// of a repository: the repository's LICENSE comes along.
		zfiles = append(zfiles, repoFile{root: root, name: "LICENSE", rel: "LICENSE"})
	}
	var zip bytes.Buffer
	mv := module.Version{Path: m.path(), Version: version}
	if err := modzip.Create(&zip, mv, zfiles); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path.Join(m.dir, "go.mod"))))
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  gomod,
		version + ".zip":  zip.Bytes(),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// repoFile is a file of the working tree, named in the zip by rel.
type repoFile struct{ root, name, rel string }

func (f repoFile) Path() string { return f.rel }

func (f repoFile) Lstat() (os.FileInfo, error) {
	return os.Lstat(filepath.Join(f.root, filepath.FromSlash(f.name)))
}

func (f repoFile) Open() (io.ReadCloser, error) {
	return os.Open(filepath.Join(f.root, filepath.FromSlash(f.name)))
}
