package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// readBody reads a request body of at most MaxBodyBytes. When it cannot, it
// answers itself: 413 when the body is too large, 408 when the client sends
// it too slowly for the server's ReadTimeout, 400 otherwise. The read
// error's own text names socket addresses ("read tcp 10.0.0.1:8080->..."),
// so it goes to the debug log, never to the client.
//
// Until the body is whole the request is not in progress: under a
// ConnLimit at its cap, a new connection may take this one's slot (see
// awaitBody). readBody then answers nothing, and the request is dropped
// unanswered and not acted on.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	received := awaitBody(r)
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if !received() {
		s.log.Debug("a connection sending its request body was closed for a new one", "path", r.URL.Path)
		return nil, false
	}
	if err == nil {
		return raw, true
	}
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mbe):
		writeJSON(w, http.StatusRequestEntityTooLarge, apiError{Error: fmt.Sprintf("body over %d bytes", MaxBodyBytes)})
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		// The connection's read deadline has passed: it is good for nothing
		// but this answer.
		w.Header().Set("Connection", "close")
		writeJSON(w, http.StatusRequestTimeout, apiError{Error: "request body too slow: send the whole request within the server's read timeout"})
	default:
		writeJSON(w, http.StatusBadRequest, apiError{Error: "could not read the request body"})
	}
	s.log.Debug("reading a request body failed", "path", r.URL.Path, "err", err)
	return nil, false
}

// wireRequest is a Request as it comes off the wire. Its strings stay raw:
// encoding/json would turn invalid UTF-8 and lone surrogate escapes
// ("\ud800") into U+FFFD, so that different ids would share one counter.
// jsonString refuses them instead.
type wireRequest struct {
	Rule json.RawMessage `json:"rule"`
	ID   json.RawMessage `json:"id"`
	Cost *int64          `json:"cost"`
	Tier json.RawMessage `json:"tier"`
}

// wireLeaseRequest is a LeaseRequest as it comes off the wire, raw for the
// same reason as wireRequest.
type wireLeaseRequest struct {
	Lease json.RawMessage `json:"lease"`
	Rule  json.RawMessage `json:"rule"`
	ID    json.RawMessage `json:"id"`
}

// fieldError is a member of a request's JSON object that the decoder
// would have taken for another, or twice.
type fieldError struct {
	field string // the member's name as sent
	msg   string
}

func (e *fieldError) Error() string { return e.msg }

// exactFields checks the member names of the JSON object in raw against
// names, the JSON names of the fields of the struct the body decodes into.
// encoding/json matches a name to a field without regard to case (Unicode
// folding: "ID", "Id" and "iD" are id, and "coſt" is cost) and keeps the
// last of a repeated member, so {"id": "u5", "id": "u6"} would count u6
// while a proxy or log reading the first saw u5. Here a name must be one of
// names exactly, once. A name is compared as JSON decodes it, so "i\u0064"
// is id, and a repeat of it. A body that is not an object, or not JSON,
// passes: the decoder reports it.
func exactFields(raw []byte, names []string) *fieldError {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var seen uint64 // by index in names
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, ok := tok.(string)
		if !ok {
			return nil
		}
		i := slices.Index(names, name)
		switch {
		case i < 0:
			for _, n := range names {
				if strings.EqualFold(n, name) {
					return &fieldError{name, fmt.Sprintf("unknown field %q: field names are case-sensitive; did you mean %q?", name, n)}
				}
			}
			return &fieldError{name, fmt.Sprintf("unknown field %q (this endpoint takes %s)", name, strings.Join(names, ", "))}
		case seen&(1<<i) != 0:
			return &fieldError{name, fmt.Sprintf("duplicate field %q: give each field once", name)}
		}
		seen |= 1 << i
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return nil
		}
	}
	return nil
}

// jsonNamesOf caches jsonNames by struct type.
var jsonNamesOf sync.Map // reflect.Type → []string

// jsonNames returns the JSON names of the fields of the struct *v points
// to, as encoding/json reads them: a tag's name, else the Go name; fields
// tagged "-" and unexported ones are left out. Bodies decode into flat
// structs of at most 64 fields, which exactFields relies on.
func jsonNames(v any) []string {
	t := reflect.TypeOf(v).Elem()
	if names, ok := jsonNamesOf.Load(t); ok {
		return names.([]string)
	}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case !f.IsExported() || name == "-":
			continue
		case name == "":
			name = f.Name
		}
		names = append(names, name)
	}
	if len(names) > 64 {
		panic(fmt.Sprintf("server: %v has %d JSON fields; exactFields tracks 64", t, len(names)))
	}
	jsonNamesOf.Store(t, names)
	return names
}

// jsonString decodes raw, one JSON value, into *dst when it is a string
// that decodes losslessly: valid UTF-8, and every \uD800-\uDFFF escape half
// of a surrogate pair. null leaves *dst alone. The error completes a
// sentence that starts with the field's name.
func jsonString(raw json.RawMessage, dst *string) error {
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil
	case raw[0] != '"':
		return errors.New("must be a string")
	case !utf8.Valid(raw):
		return errors.New("is not valid UTF-8")
	}
	if esc := loneSurrogate(raw); esc != "" {
		return fmt.Errorf(`holds a lone UTF-16 surrogate (%s), which is not a character`, esc)
	}
	return json.Unmarshal(raw, dst)
}

// loneSurrogate returns the first \uD800-\uDFFF escape in s, a well-formed
// JSON string literal, that is not half of a valid surrogate pair, or "".
func loneSurrogate(s []byte) string {
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		i++ // s[i] is the escaped byte: any other escape is two bytes long
		if i >= len(s) || s[i] != 'u' {
			continue
		}
		r, ok := hex4(s[i+1:])
		if !ok {
			continue // not well-formed; the JSON decoder has said so already
		}
		esc := string(s[i-1 : i+5])
		i += 4 // the last hex digit
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return esc // a low half with no high half before it
		case r >= 0xD800 && r <= 0xDBFF:
			if len(s) > i+2 && s[i+1] == '\\' && s[i+2] == 'u' {
				if lo, ok := hex4(s[i+3:]); ok && lo >= 0xDC00 && lo <= 0xDFFF {
					i += 6
					continue
				}
			}
			return esc
		}
	}
	return ""
}

// hex4 parses the four hex digits that start b.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// trailing reports whether anything but white space follows the first JSON
// value in raw, which ends at offset.
func trailing(raw []byte, offset int64) bool {
	return len(bytes.TrimSpace(raw[offset:])) > 0
}
