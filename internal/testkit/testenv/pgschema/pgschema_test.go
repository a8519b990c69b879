package pgschema

import "testing"

func TestURL(t *testing.T) {
	for _, c := range []struct{ server, want string }{
		{"postgres://u:p@h:5432/db?sslmode=disable", "postgres://u:p@h:5432/db?search_path=s&sslmode=disable"},
		{"postgresql://h/db", "postgresql://h/db?search_path=s"},
		{"postgres://h/db?search_path=other", "postgres://h/db?search_path=s"},
		{"host=h dbname=db", "host=h dbname=db search_path=s"},
	} {
		if got := URL(c.server, "s"); got != c.want {
			t.Errorf("URL(%q, s) = %q, want %q", c.server, got, c.want)
		}
	}
}

func TestRedact(t *testing.T) {
	if got := Redact("postgres://u:secret@h:5433/db"); got != "h:5433/db" {
		t.Errorf("Redact = %q, want h:5433/db", got)
	}
}
