package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
)

// authorized reports whether r carries "Authorization: Bearer <token>" with
// the configured token, and answers 401 itself when it does not. Both sides
// are hashed before the constant-time comparison, so neither the token's
// bytes nor its length leak through timing.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	scheme, cred, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	cred = strings.TrimSpace(cred)
	if !strings.EqualFold(scheme, "Bearer") || cred == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="countlimit"`)
		writeJSON(w, http.StatusUnauthorized, apiError{Error: "authentication required: send Authorization: Bearer <token>"})
		return false
	}
	sum := sha256.Sum256([]byte(cred))
	if subtle.ConstantTimeCompare(sum[:], s.token[:]) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="countlimit", error="invalid_token"`)
		writeJSON(w, http.StatusUnauthorized, apiError{Error: "invalid token"})
		return false
	}
	return true
}
