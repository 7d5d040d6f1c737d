package interceptor

// RouteCount returns the number of routes c has cached.
func RouteCount(c *Client) int { return c.routes.Len() }

// SetReplayedHook sets a function that runs between a new stream attempt's
// replay and its installation as the current attempt; nil removes it.
func SetReplayedHook(f func()) { testHookReplayed = f }
