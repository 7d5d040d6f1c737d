package interceptor

import "github.com/stormguard/stormguard/idempotency"

// checkMarks logs what the protobuf registry can tell of the WithIdempotent
// entries (see idempotency.CheckMarks): a warning for a method it does not
// know in a service it knows (or a service it knows under another case),
// since such an entry marks nothing; and, for a whole-service entry, the
// methods it marks, writes included. Entries of services the registry does
// not know cannot be checked and are not logged.
func (c *Client) checkMarks() {
	if len(c.o.idempotent) == 0 {
		return
	}
	for _, m := range idempotency.CheckMarks(nil, c.o.idempotent) {
		switch {
		case m.Unknown:
			args := []any{"entry", m.Entry, "service", m.Service}
			if m.Closest != "" {
				args = append(args, "closest", m.Closest)
			}
			args = append(args, "methods", m.Methods)
			c.logger().Warn("stormguard: WithIdempotent names a method the protobuf registry does not know in a service it knows: the entry marks nothing (method names are the RPC's, as in the proto, case included)", args...)
		case !m.Checked && m.Closest != "":
			c.logger().Warn("stormguard: WithIdempotent names a service the protobuf registry knows only under another case: the entry marks nothing",
				"entry", m.Entry, "closest", m.Closest)
		case m.WholeService && m.Checked:
			c.logger().Info("stormguard: WithIdempotent marks a whole service: these methods may now be retried, writes included",
				"entry", m.Entry, "marked", m.Marked)
		}
		if len(m.SendOnce) > 0 {
			c.logger().Warn("stormguard: WithIdempotent names methods whose proto marks them send_once: they are not marked, and are sent once",
				"entry", m.Entry, "send_once", m.SendOnce)
		}
	}
}
