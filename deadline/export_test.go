package deadline

import "time"

// SetClientClock makes c read its time from now instead of time.Now: the
// tests' window on when a Client wrote its header (and a fixed instant to
// measure a default timeout from).
func SetClientClock(c *Client, now func() time.Time) { c.now = now }

// SetServerClock makes s read its time from now instead of time.Now: the
// tests' window on when a Server applied a header (and a fixed instant to
// apply one at).
func SetServerClock(s *Server, now func() time.Time) { s.now = now }
