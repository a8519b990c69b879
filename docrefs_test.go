package countlimit_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocReferencesResolve: every relative link of the Markdown files
// (README.md, docs/ and the rest the repository holds) names a file that
// exists, and an anchor that one of its headings makes; every reference to
// a section, a Markdown file's name and then the section's title in double
// quotes — in Markdown, Go, SQL, shell and Lua files, comments included,
// across line breaks — names a heading or a bold paragraph title of that
// file. A reader sent to a place finds it.
func TestDocReferencesResolve(t *testing.T) {
	out, err := exec.Command("git", "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (the test reads the files git tracks)", err)
	}
	var files []string
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		switch filepath.Ext(f) {
		case ".md", ".go", ".sql", ".sh", ".lua", ".yaml":
			if _, err := os.Stat(f); err == nil { // a file deleted but not yet from the index
				files = append(files, f)
			}
		}
	}
	docs := map[string]*mdDoc{} // by path
	for _, f := range files {
		if filepath.Ext(f) == ".md" {
			docs[f] = readMD(t, f)
		}
	}
	// byName finds the Markdown file a reference names: a path from the
	// root or from the referring file's folder, else the one file of that
	// base name.
	byName := func(from, name string) *mdDoc {
		for _, p := range []string{filepath.Clean(name), filepath.Join(filepath.Dir(from), name)} {
			if d, ok := docs[p]; ok {
				return d
			}
		}
		var found *mdDoc
		for p, d := range docs {
			if filepath.Base(p) == filepath.Base(name) {
				if found != nil {
					return nil // ambiguous: the reference must say which
				}
				found = d
			}
		}
		return found
	}

	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	section := regexp.MustCompile(`([A-Za-z0-9_./-]+\.md),? "([^"]{3,160})"`)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		if filepath.Ext(f) == ".md" {
			for _, m := range link.FindAllStringSubmatch(withoutCode(text), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				dest := f
				if path != "" {
					dest = filepath.Join(filepath.Dir(f), path)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s: the link %q names %s, which does not exist", f, target, dest)
						continue
					}
				}
				if anchor == "" {
					continue
				}
				d, ok := docs[filepath.Clean(dest)]
				if !ok {
					continue // an anchor into a file that is not Markdown (a line of code)
				}
				if !d.anchors[anchor] {
					t.Errorf("%s: the link %q names the anchor #%s, which no heading of %s makes", f, target, anchor, d.path)
				}
			}
		}
		for _, m := range section.FindAllStringSubmatch(joinComments(text), -1) {
			d := byName(f, m[1])
			if d == nil {
				t.Errorf("%s: the reference %s, %q names no Markdown file of the repository (or more than one)", f, m[1], m[2])
				continue
			}
			if !d.sections[normSection(m[2])] {
				t.Errorf("%s: the reference %s, %q names no heading or bold title of %s", f, m[1], m[2], d.path)
			}
		}
	}
}

// mdDoc is what a Markdown file offers a reference: the anchors its
// headings make and the titles of its sections (headings and bold
// paragraph titles), normalized by normSection.
type mdDoc struct {
	path     string
	anchors  map[string]bool
	sections map[string]bool
}

func readMD(t *testing.T, path string) *mdDoc {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := &mdDoc{path: path, anchors: map[string]bool{}, sections: map[string]bool{}}
	seen := map[string]int{}
	bold := regexp.MustCompile(`^\*\*([^*]+?)\*\*`)
	inCode := false
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		if h, ok := heading(line); ok {
			slug := githubSlug(h)
			if n := seen[slug]; n > 0 {
				d.anchors[fmt.Sprintf("%s-%d", slug, n)] = true
			} else {
				d.anchors[slug] = true
			}
			seen[slug]++
			d.sections[normSection(h)] = true
			continue
		}
		if m := bold.FindStringSubmatch(line); m != nil {
			d.sections[normSection(m[1])] = true
		}
	}
	// A reference may leave out a title's tail: what follows its first
	// colon or comma, or a closing parenthesis.
	paren := regexp.MustCompile(` \([^)]*\)$`)
	for s := range d.sections {
		d.sections[paren.ReplaceAllString(s, "")] = true
		for _, sep := range []string{": ", ", "} {
			if head, _, ok := strings.Cut(s, sep); ok {
				d.sections[head] = true
			}
		}
	}
	return d
}

// heading returns the text of a Markdown ATX heading.
func heading(line string) (string, bool) {
	trimmed := strings.TrimLeft(line, "#")
	if n := len(line) - len(trimmed); n == 0 || n > 6 || !strings.HasPrefix(trimmed, " ") {
		return "", false
	}
	return strings.TrimSpace(trimmed), true
}

// githubSlug is the anchor GitHub makes of a heading: lower case, spaces
// to hyphens, punctuation but hyphens and underscores dropped.
func githubSlug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// normSection is a section title as references are compared with it:
// without Markdown's code marks and a closing period, in lower case.
func normSection(s string) string {
	s = strings.ReplaceAll(s, "`", "")
	s = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(s), "."))
	return strings.ToLower(strings.Join(strings.Fields(s), " "))
}

// withoutCode is Markdown text without its fenced code blocks.
func withoutCode(text string) string {
	var b strings.Builder
	inCode := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
			continue
		}
		if !inCode {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// joinComments is text with each line's comment marks (//, --, #) and
// indentation dropped and its lines joined by spaces, so that a reference
// broken across two lines of a comment reads as one.
func joinComments(text string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		l = strings.TrimSpace(l)
		for _, mark := range []string{"//", "--", "#"} {
			if strings.HasPrefix(l, mark) {
				l = strings.TrimSpace(strings.TrimLeft(l, mark[:1]))
				break
			}
		}
		lines[i] = l
	}
	return strings.Join(lines, " ")
}
