package server

import "time"

// SetNow replaces the clock s's store state reads, before s serves.
func SetNow(s *Server, now func() time.Time) { s.state.now = now }
