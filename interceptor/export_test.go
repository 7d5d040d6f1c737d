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

// Seal returns this process's seal, which marks the refusals it made.
func Seal() string { return seal }
