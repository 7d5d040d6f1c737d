// Package breakerticket reports a breaker.Ticket that one goroutine alone
// reports through, without the compare-and-swap that Ticket.DoneAt takes
// so that concurrent reports count once (package breaker does not export
// it: a Ticket's documented guarantee is the concurrent one). The module's
// client engine reports an attempt's Ticket on the goroutine that ends the
// attempt, once, and saves a locked instruction on every call.
package breakerticket

import "time"

// DoneAt reports the outcome of the attempt the *breaker.Ticket t points
// to at now, as Ticket.DoneAt does, unless t was reported already. t must
// not be reported concurrently. Package breaker sets DoneAt when it is
// initialized, which is before any program can have a Ticket.
var DoneAt func(t any, failed bool, now time.Time)
