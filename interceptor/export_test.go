package interceptor

import "github.com/stormguard/stormguard/overload"

// RouteCount returns the number of routes c has cached.
func RouteCount(c *Client) int { return c.routes.Len() }

// SetReplayedHook sets a function that runs between a new stream attempt's
// replay and its installation as the current attempt; nil removes it.
func SetReplayedHook(f func()) { testHookReplayed = f }

// MaxRoutes is the bound on the routes, breakers and endpoint tables a
// Client keeps.
const MaxRoutes = maxRoutes

// OverloadOf returns s's overload protection (nil: off).
func OverloadOf(s *Server) *overload.Guard { return s.ov.guard }

// Propagates reports whether a refusal for r makes the Server answer
// grpc-retry-pushback-ms: -1.
func Propagates(r Reason) bool { return r.propagates() }

// Remembered returns how many failed calls c remembers, and their bytes.
func Remembered(c *Client) (n, bytes int) {
	t := c.returns.Load()
	if t == nil {
		return 0, 0
	}
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, head := range sh.m {
			n += chainLen(head)
		}
		bytes += sh.bytes
		sh.mu.Unlock()
	}
	return n, bytes
}

func chainLen(e *returned) (n int) {
	for ; e != nil; e = e.next {
		n++
	}
	return n
}

// ForgetAll drops every failed call c remembers.
func ForgetAll(c *Client) { c.returns.Store(nil) }

// Seal returns this process's seal, which marks the refusals it made.
func Seal() string { return seal }
