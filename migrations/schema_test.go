package migrations_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/internal/store/pgmigrate"
	"github.com/countlimit/countlimit/internal/testkit/testbackend"
)

var update = flag.Bool("update", false, "write the schema the migrations make to "+schemaFile)

func TestMain(m *testing.M) { testbackend.Main(m) }

// schemaFile is the schema at the latest migration, for people to read.
const schemaFile = "../docs/schema.sql"

// regenerate is the command that rewrites schemaFile.
const regenerate = "go test ./migrations -run TestSchemaFileIsTheMigrations -update"

// schemaHeader is schemaFile's first lines; %d are the major versions of
// pg_dump and of the server it dumped.
const schemaHeader = `-- countlimit's PostgreSQL schema at its latest migration, for reading:
-- what the migrations in migrations/ make of an empty schema, as
-- pg_dump %d --schema-only prints it from PostgreSQL %d, without the
-- schema's name, settings and goose's version table. Generated, never
-- edited: the migrations are the source, and a test fails when this
-- file differs from what they make. To write it again:
--
--   ` + regenerate + `
`

// TestSchemaFileIsTheMigrations migrates an empty schema to the latest
// migration, dumps it with pg_dump --schema-only, and holds
// docs/schema.sql to that dump, normalized (normalizeDump). Both need the
// same major version of PostgreSQL and pg_dump as the file says, since
// each version prints a schema its own way.
func TestSchemaFileIsTheMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testbackend.FreshSchema(t)
	p, closeDB, err := pgmigrate.NewProvider(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer closeDB()
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	var schema string
	var serverNum int
	if err := pool.QueryRow(ctx, "SELECT current_schema(), current_setting('server_version_num')::int").Scan(&schema, &serverNum); err != nil {
		t.Fatal(err)
	}
	server := serverNum / 10000
	pgDump, dumpMajor, err := findPgDump(server)
	if err != nil {
		testbackend.Unavailable(t, fmt.Sprintf("pg_dump of PostgreSQL %d (package postgresql-client-%d)", server, server), err)
	}
	header := fmt.Sprintf(schemaHeader, dumpMajor, server)
	old, err := os.ReadFile(schemaFile)
	if err != nil && !(errors.Is(err, os.ErrNotExist) && *update) {
		t.Fatalf("%v: write it with %s", err, regenerate)
	}
	if !*update && !bytes.HasPrefix(old, []byte(header)) {
		if m := regexp.MustCompile(`pg_dump (\d+) --schema-only prints it from PostgreSQL (\d+)`).FindSubmatch(old); m != nil {
			if want := fmt.Sprintf("pg_dump %s, PostgreSQL %s", m[1], m[2]); want != fmt.Sprintf("pg_dump %d, PostgreSQL %d", dumpMajor, server) {
				testbackend.Unavailable(t, want+" (the versions "+schemaFile+" was dumped with)",
					fmt.Errorf("here pg_dump %d and PostgreSQL %d print a schema their own way", dumpMajor, server))
			}
		}
	}

	cmd := exec.CommandContext(ctx, pgDump, "--schema-only", "--no-owner", "--no-privileges",
		"--schema="+schema, "--exclude-table="+schema+"."+pgmigrate.VersionTable+"*",
		"--dbname="+testbackend.PostgresURL(t))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, stderr.String())
	}
	got := header + normalizeDump(string(out), schema)
	if *update {
		if err := os.WriteFile(schemaFile, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", schemaFile)
		return
	}
	if string(old) != got {
		t.Errorf("%s is not the schema the migrations make (- the file, + the migrations):\n%s\nIf the migrations are right, write it again: %s",
			schemaFile, lineDiff(string(old), got), regenerate)
	}
}

// findPgDump returns a pg_dump of PostgreSQL major: Debian's
// /usr/lib/postgresql/<major>/bin/pg_dump, else the one on PATH when it is
// of that version.
func findPgDump(major int) (string, int, error) {
	candidates := []string{filepath.Join("/usr/lib/postgresql", fmt.Sprint(major), "bin", "pg_dump")}
	if p, err := exec.LookPath("pg_dump"); err == nil {
		candidates = append(candidates, p)
	}
	var found []string
	for _, c := range candidates {
		out, err := exec.Command(c, "--version").Output()
		if err != nil {
			continue
		}
		var v int
		if m := regexp.MustCompile(`\) (\d+)`).FindSubmatch(out); m != nil {
			fmt.Sscan(string(m[1]), &v)
		}
		if v == major {
			return c, v, nil
		}
		found = append(found, fmt.Sprintf("%s is %s", c, strings.TrimSpace(string(out))))
	}
	if len(found) == 0 {
		return "", 0, errors.New("no pg_dump in /usr/lib/postgresql or on PATH")
	}
	return "", 0, fmt.Errorf("no pg_dump %d: %s", major, strings.Join(found, "; "))
}

// normalizeDump keeps of pg_dump's text the schema's objects only: no SET
// lines, no version or \restrict lines, no CREATE SCHEMA, no schema name,
// one blank line at most between statements. It orders them for a reader,
// each with its comments, as they restore: the tables, their keys and
// indexes, the view, then the functions (pg_dump puts these first); each
// group in pg_dump's order.
func normalizeDump(dump, schema string) string {
	skip := regexp.MustCompile(`^(SET |SELECT pg_catalog\.set_config\(|\\restrict |\\unrestrict |-- Dumped (from|by) |-- PostgreSQL database dump|--$|CREATE SCHEMA )`)
	owner := regexp.MustCompile(`; Schema: [^;]*; Owner: -$`)
	typ := regexp.MustCompile(`^-- Name: .*; Type: ([A-Z ]+)$`)
	rank := map[string]int{"TABLE": 0, "CONSTRAINT": 1, "INDEX": 1, "FK CONSTRAINT": 1, "VIEW": 2, "FUNCTION": 3}
	type section struct {
		rank  int
		lines []string
	}
	var sections []*section
	dump = strings.ReplaceAll(dump, schema+".", "")
	for _, line := range strings.Split(dump, "\n") {
		line = owner.ReplaceAllString(strings.TrimRight(line, " \t"), "")
		if skip.MatchString(line) || strings.HasPrefix(line, "-- Name: "+schema+"; Type: SCHEMA") {
			continue
		}
		if m := typ.FindStringSubmatch(line); m != nil && m[1] != "COMMENT" {
			r, ok := rank[m[1]]
			if !ok {
				r = len(rank) // anything else last, in pg_dump's order
			}
			sections = append(sections, &section{rank: r})
		}
		if len(sections) == 0 {
			continue // before the first object: nothing of the schema's
		}
		last := sections[len(sections)-1]
		if line == "" && (len(last.lines) == 0 || last.lines[len(last.lines)-1] == "") {
			continue
		}
		last.lines = append(last.lines, line)
	}
	slices.SortStableFunc(sections, func(a, b *section) int { return a.rank - b.rank })
	var b strings.Builder
	for _, s := range sections {
		b.WriteString("\n")
		b.WriteString(strings.TrimRight(strings.Join(s.lines, "\n"), "\n"))
		b.WriteString("\n")
	}
	return b.String()
}

// lineDiff lists, in order, the lines only one of a and b has, with their
// line numbers.
func lineDiff(a, b string) string {
	as, bs := strings.Split(a, "\n"), strings.Split(b, "\n")
	inA, inB := map[string]int{}, map[string]int{}
	for _, l := range as {
		inA[l]++
	}
	for _, l := range bs {
		inB[l]++
	}
	var out []string
	for i, l := range as {
		if inB[l] < inA[l] {
			out = append(out, fmt.Sprintf("- %d: %s", i+1, l))
		}
	}
	for i, l := range bs {
		if inA[l] < inB[l] {
			out = append(out, fmt.Sprintf("+ %d: %s", i+1, l))
		}
	}
	if len(out) > 40 {
		out = append(out[:40], fmt.Sprintf("... and %d lines more", len(out)-40))
	}
	return strings.Join(out, "\n")
}
