package repocheck_test

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The Markdown the project publishes: what the link and code block tests
// read. Paths are relative to the repository root (this module's
// directory).
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md"}
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md found: run the test from the repository root")
	}
	return append(files, docs...)
}

// mdDoc is one Markdown file, split into what the tests need: its fenced
// code blocks, its headings' anchors and its links.
type mdDoc struct {
	path    string   // relative to the repository root
	blocks  []mdCode // fenced code blocks
	anchors map[string]bool
	links   []mdLink
}

// mdCode is one fenced code block.
type mdCode struct {
	line int    // line of the block's first content line (1-based)
	lang string // the fence's info string up to the first space: "go", "sh", ""
	text string // the content, the fence's indentation removed
}

// mdLink is one link or image target outside code.
type mdLink struct {
	line   int
	target string
}

var (
	fenceOpen = regexp.MustCompile("^( {0,3}|\\s*)(```+|~~~+)\\s*([^\\s`]*)")
	atxHead   = regexp.MustCompile(`^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$`)
	// [text](target "title") and ![alt](target); the text may hold one
	// level of brackets.
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	refDef     = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	htmlTarget = regexp.MustCompile(`<(?:a|img)\s[^>]*?(?:href|src)="([^"]*)"`)
	htmlAnchor = regexp.MustCompile(`<a\s[^>]*?(?:id|name)="([^"]*)"`)
)

// parseMarkdown reads a Markdown file the way the tests need it: fenced
// blocks (at any indentation, so inside list items too) are code, and
// code spans may run over a line break.
func parseMarkdown(t *testing.T, path string) *mdDoc {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := &mdDoc{path: path, anchors: map[string]bool{}}
	lines := strings.Split(string(raw), "\n")
	slugs := map[string]int{}
	var para []string // the current run of prose lines
	paraStart := 0
	flush := func() {
		if len(para) > 0 {
			d.scanProse(strings.Join(para, "\n"), paraStart)
		}
		para = nil
	}
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := fenceOpen.FindStringSubmatch(line); m != nil {
			flush()
			indent, fence, lang := len(m[1]), m[2], m[3]
			var body []string
			j := i + 1
			for ; j < len(lines); j++ {
				l := lines[j]
				if trimmed := strings.TrimLeft(l, " \t"); strings.HasPrefix(trimmed, fence) && strings.TrimSpace(strings.TrimLeft(trimmed, fence[:1])) == "" {
					break
				}
				body = append(body, cutIndent(l, indent))
			}
			d.blocks = append(d.blocks, mdCode{line: i + 2, lang: lang, text: strings.Join(body, "\n")})
			i = j
			continue
		}
		if m := atxHead.FindStringSubmatch(line); m != nil {
			flush()
			s := githubSlug(m[2])
			if n, seen := slugs[s]; seen {
				slugs[s] = n + 1
				s += "-" + strconv.Itoa(n+1)
			} else {
				slugs[s] = 0
			}
			d.anchors[s] = true
			d.scanProse(m[2], i+1)
			continue
		}
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if len(para) == 0 {
			paraStart = i + 1
		}
		para = append(para, line)
	}
	flush()
	return d
}

// cutIndent removes up to n leading spaces (a fence's indentation) from l.
func cutIndent(l string, n int) string {
	for i := 0; i < n && strings.HasPrefix(l, " "); i++ {
		l = l[1:]
	}
	return l
}

// scanProse collects the links and HTML anchors of prose that starts at
// line first, code spans left out.
func (d *mdDoc) scanProse(text string, first int) {
	text = blankCodeSpans(text)
	lineOf := func(off int) int { return first + strings.Count(text[:off], "\n") }
	for _, re := range []*regexp.Regexp{inlineLink, refDef, htmlTarget} {
		for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
			d.links = append(d.links, mdLink{line: lineOf(m[0]), target: text[m[2]:m[3]]})
		}
	}
	for _, m := range htmlAnchor.FindAllStringSubmatch(text, -1) {
		d.anchors[m[1]] = true
	}
}

// blankCodeSpans replaces every code span (a run of n backticks up to the
// next run of exactly n) with spaces, keeping line breaks, so that what is
// quoted as code is never taken for a link.
func blankCodeSpans(s string) string {
	b := []byte(s)
	run := func(i int) int {
		j := i
		for j < len(b) && b[j] == '`' {
			j++
		}
		return j - i
	}
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := run(i)
		end := -1
		for j := i + n; j < len(b); {
			if b[j] != '`' {
				j++
				continue
			}
			if m := run(j); m == n {
				end = j + m
				break
			} else {
				j += m
			}
		}
		if end < 0 { // no closing run: literal backticks
			i += n
			continue
		}
		for k := i; k < end; k++ {
			if b[k] != '\n' {
				b[k] = ' '
			}
		}
		i = end
	}
	return string(b)
}

// githubSlug is the anchor GitHub gives a heading: the rendered text
// (code spans and links reduced to their text, emphasis markers dropped)
// in lower case, every character that is not a letter, a digit, a mark,
// '-', '_' or a space removed, and each space turned into '-'. Repeated
// slugs get "-1", "-2", … (parseMarkdown adds those).
func githubSlug(heading string) string {
	heading = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	heading = regexp.MustCompile(`<[^>]+>`).ReplaceAllString(heading, "")
	heading = strings.NewReplacer("`", "", "*", "").Replace(heading)
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-', r == '_', unicode.IsLetter(r), unicode.IsDigit(r), unicode.Is(unicode.M, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

var urlScheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)

// TestMarkdownLinks fails on a relative link or #anchor in the README,
// CONTRIBUTING.md, the CHANGELOG or docs/*.md that points nowhere: a file
// or directory that does not exist, or a heading (with GitHub's anchor
// rules) or HTML anchor that the target page lacks. Links with a scheme
// (https:, mailto:) are not followed.
func TestMarkdownLinks(t *testing.T) {
	t.Parallel()
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	docs := map[string]*mdDoc{}
	load := func(path string) *mdDoc {
		if d, ok := docs[path]; ok {
			return d
		}
		d := parseMarkdown(t, path)
		docs[path] = d
		return d
	}
	files := markdownFiles(t)
	checked := 0
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		d := load(f)
		for _, l := range d.links {
			if l.target == "" || urlScheme.MatchString(l.target) || strings.HasPrefix(l.target, "//") {
				continue
			}
			checked++
			where := fmt.Sprintf("%s:%d: link %q", f, l.line, l.target)
			p, frag, _ := strings.Cut(l.target, "#")
			p, err := url.PathUnescape(p)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			target := f
			if p != "" {
				if strings.HasPrefix(p, "/") { // GitHub: from the repository root
					target = filepath.Clean(strings.TrimPrefix(p, "/"))
				} else {
					target = filepath.Join(filepath.Dir(f), p)
				}
				if abs := filepath.Join(root, target); abs != root && !strings.HasPrefix(abs, root+string(filepath.Separator)) {
					t.Errorf("%s: points outside the repository", where)
					continue
				}
				if _, err := os.Stat(target); err != nil {
					t.Errorf("%s: no such file or directory %s", where, target)
					continue
				}
			}
			if frag == "" {
				continue
			}
			switch {
			case strings.HasSuffix(target, ".md"):
				if !load(target).anchors[frag] {
					t.Errorf("%s: %s has no heading or anchor #%s (anchors: %s)", where, target, frag, strings.Join(sortedKeys(load(target).anchors), " "))
				}
			case regexp.MustCompile(`^L\d+(-L\d+)?$`).MatchString(frag):
				raw, err := os.ReadFile(target)
				if err != nil {
					t.Errorf("%s: %v", where, err)
					continue
				}
				for _, n := range strings.Split(strings.TrimPrefix(frag, "L"), "-L") {
					if k, _ := strconv.Atoi(n); k > strings.Count(string(raw), "\n")+1 {
						t.Errorf("%s: %s has no line %d", where, target, k)
					}
				}
			default:
				t.Errorf("%s: #%s into %s, which is neither Markdown nor a line reference", where, frag, target)
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d relative links found in %v; is the parser broken?", checked, files)
	}
}

func sortedKeys(m map[string]bool) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TestMarkdownParsing holds the parser the link and code block tests share
// to GitHub's rules on a sample.
func TestMarkdownParsing(t *testing.T) {
	t.Parallel()
	for heading, want := range map[string]string{
		"HTTP: the `idemhttp` middleware":                               "http-the-idemhttp-middleware",
		"In the browser: the operator console":                          "in-the-browser-the-operator-console",
		"`outcome` (`observe.Outcome`, listed by `observe.Outcomes()`)": "outcome-observeoutcome-listed-by-observeoutcomes",
		"stepfunctions-local vs AWS":                                    "stepfunctions-local-vs-aws",
		"(a) From the workflow's last step: a task token":               "a-from-the-workflows-last-step-a-task-token",
		"Migrating from [Powertools](https://example.com) **now**":      "migrating-from-powertools-now",
		"Redis — Cluster & Sentinel":                                    "redis--cluster--sentinel",
		"list_stuck résumé":                                             "list_stuck-résumé",
	} {
		if got := githubSlug(heading); got != want {
			t.Errorf("githubSlug(%q) = %q, want %q", heading, got, want)
		}
	}

	dir := t.TempDir()
	sample := strings.Join([]string{
		"# Title", // 1
		"",        // 2
		"See [a](b.md#c) and `[not](a-link.md)`, and `a", // 3
		"[span](over-lines.md)` too.",                    // 4
		"",                                               // 5
		"- item",                                         // 6
		"",                                               // 7
		"  ```go",                                        // 8
		"  x := 1",                                       // 9
		"  ```",                                          // 10
		"",                                               // 11
		"## Title",                                       // 12
		"",                                               // 13
		"```sh",                                          // 14
		"# not a heading [nor](a-link.md)",               // 15
		"```",                                            // 16
		"![img](img/x.png) <a id=\"here\"></a>",          // 17
		"[ref]: ../other.md",                             // 18
	}, "\n")
	path := filepath.Join(dir, "s.md")
	if err := os.WriteFile(path, []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	d := parseMarkdown(t, path)
	wantLinks := []mdLink{{3, "b.md#c"}, {17, "img/x.png"}, {18, "../other.md"}}
	if !slices.Equal(d.links, wantLinks) {
		t.Errorf("links = %v, want %v", d.links, wantLinks)
	}
	wantAnchors := []string{"here", "title", "title-1"}
	if got := sortedKeys(d.anchors); !slices.Equal(got, wantAnchors) {
		t.Errorf("anchors = %v, want %v", got, wantAnchors)
	}
	wantBlocks := []mdCode{{9, "go", "x := 1"}, {15, "sh", "# not a heading [nor](a-link.md)"}}
	if !slices.Equal(d.blocks, wantBlocks) {
		t.Errorf("blocks = %+v, want %+v", d.blocks, wantBlocks)
	}
}

// TestMarkdownIndexListsEveryGuide fails when a page of docs/ is missing
// from the index, docs/README.md, so a new guide cannot be left where no
// reader finds it.
func TestMarkdownIndexListsEveryGuide(t *testing.T) {
	t.Parallel()
	index := parseMarkdown(t, "docs/README.md")
	linked := map[string]bool{}
	for _, l := range index.links {
		p, _, _ := strings.Cut(l.target, "#")
		linked[filepath.Join("docs", p)] = true
	}
	guides, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range guides {
		if g != filepath.Join("docs", "README.md") && !linked[g] {
			t.Errorf("docs/README.md does not link %s", g)
		}
	}
}
