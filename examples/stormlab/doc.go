// Command stormlab reruns, on this machine, the retry-storm scenarios that
// published articles measured (the README names them), and prints one table
// per scenario with one row per client policy: no retries, three attempts
// without a budget, grpc-go's own retryPolicy (with and without
// retryThrottling), the suite with its budget only, and the suite with its
// defaults (and, in scenario 9, the suite with the outlier load-balancing
// policy; in scenarios 1-4 and 6, the suite in shadow mode, which refuses
// nothing and shows what it would have refused; in scenario 12, the
// suite's client with a plain server and with its own, and grpc-go's
// clients with the suite's server; in scenario 13, the suite with calls
// marked by priority; in scenario 14, fleets that mix grpc-go's clients
// and the suite's, with and without the suite's server).
//
//	go run ./examples/stormlab              # every scenario, about 7 min
//	go run ./examples/stormlab -quick       # scenarios 1, 2, 3, 4, 7, 9 in a few seconds (CI)
//	go run ./examples/stormlab -scenario chain,tail -svg chart.svg -json
//	go run ./examples/stormlab -scenario metastable -goodput-svg goodput.svg
//	go run ./examples/stormlab -scenario fleet -fleet-clients 100 -fleet-rate 5 -fleet-p 0.5,0.9
//
// Every server and client is real gRPC on 127.0.0.1 inside this process;
// each row gets a fresh origin (internal/origin) and fresh clients, so
// budgets and breakers start empty. Calls are bounded in count and time.
// The scenarios:
//
//  1. outage, one hop: 50 concurrent callers, the origin always UNAVAILABLE;
//  2. flaky: 50 callers, 5 fail once then succeed;
//  3. fails twice: every request fails twice then succeeds;
//  4. a chain of three (and of four) services, 10 callers, a dead origin
//     (810 requests for 10 calls; 2,430);
//  5. a slow dependency (200 ms) that keeps working for callers who left,
//     with caller deadlines of 2 s and 100 ms;
//  6. independent failures: 2,000 sequential calls at p = 0.05, 0.3, 0.5,
//     0.7, 0.9;
//  7. the capacity drop of "Implementing Retry Budgets to Prevent Retry
//     Storms", a model run with the real budget and breaker on an
//     injected clock;
//  8. a long tail: 5% of attempts slow, with and without hedging; and 1% of
//     attempts 100 times slower than the others, where hedging must cut
//     the p99.9 at least tenfold for at most 2% more attempts;
//  9. one backend of N dead: 2,000 calls from 8 workers through grpc-go's
//     round_robin over 2 and over 3 origins, one answering UNAVAILABLE.
//  10. a metastable failure: an origin of fixed capacity (workers behind a
//     FIFO queue, a handler that does not watch its context) at 70% load
//     loses two thirds of its capacity for 2 s; naive retries of timed-out
//     attempts keep it down afterwards. Rows add the suite with adaptive
//     hedging (it must recover as fast as without) and the suite without
//     its server's admission, shedding or both; variants run without the
//     per-attempt timeout, with a 100 ms one (the suite's client alone, with
//     a plain server, must recover within 0.5 s) and without the trigger
//     (false refusals). In every variant the suite's defaults must serve
//     as many calls as no retries (within 0.5%), recover no later, and work
//     at most 5% of the origin's requests for callers who had left. About
//     65 s; not in -quick;
//  11. an overload blip: 2 s of overload with 100 ms deadlines; the suite's
//     protection must not outlast it, and, with and without a per-attempt
//     timeout, do no harm. About 20 s; not in -quick;
//  12. a fleet of quiet clients: 100 clients (-fleet-clients), each with its
//     own ClientConn and, in the suite's rows, its own interceptor.Client,
//     each sending 5 Puts/s (-fleet-rate) open loop to one origin that is
//     healthy for 2 s (-fleet-warmup) and then for 10 s (-fleet-seconds)
//     fails each attempt with probability p = 0.3, 0.5, 0.9, 1 (-fleet-p).
//     Rows add grpc-go's retryPolicy clients against the suite's server;
//     attempts are counted at the server and at the handler, before and
//     after the failure's first 5 s. The fleet's attempts must stay within
//     1.10× its calls after those 5 s (and 1.10× plus 5 retries per client
//     over the whole failure), at the handler too behind the suite's
//     server, at no cost in availability against no retries or grpc-go's
//     retryThrottling. Cells run side by side as far as the machine keeps
//     their schedule; a cell it cannot run in real time, even alone, is an
//     error. About 90 s; not in -quick;
//  13. an overload with priorities: twice an origin's capacity offered for
//     6 s, one call in five from a critical caller, the others from
//     sheddable ones; rows: no retries, the suite's defaults with no call
//     marked, the suite with the calls marked (priority.NewContext), and
//     the suite with every call marked critical. With priorities the
//     critical calls must succeed (≥ 99%); without a difference between
//     the callers both classes must be served alike, and every call
//     claiming critical must serve what the defaults serve; the defaults,
//     with and without a per-attempt timeout, must do no harm and waste
//     at most 5% of the origin's work. About 7 s; not in -quick; a machine
//     that cannot keep its schedule is an error;
//  14. an overload under a mixed fleet: an origin at 90% of its capacity,
//     behind a proxy's 300 ms upstream timeout, loses half of its capacity
//     for 1, 10 and 60 s (in real time), called by 20 clients with their
//     own ClientConns, half of them grpc-go's retryPolicy (5 attempts, no
//     throttling) and half the suite's; rows: no server protection (it
//     must stay down: the scenario is metastable), the suite's server
//     (also with every client grpc-go's, and with the suite's clients on
//     a per-attempt timeout), and no retries. With the suite's server and
//     its default clients or grpc-go's, goodput in the drop must be at
//     least 90% of the reduced capacity, and every second from 1 s after
//     the drop on must serve 99% of its calls; the mixed fleets must do no
//     harm. About 3 min; not in -quick.
//
// Scenarios 1-4 hold every first attempt at the origin until all callers'
// first attempts have arrived (a wave), and 6 and 8 choose failing or slow
// attempts by a seeded hash of request id and attempt, so that counts do
// not depend on goroutine scheduling; see the README for which counts may
// still vary, and why.
//
// After the tables, stormlab checks the bounds the suite's rows must meet
// (and the articles' numbers the naive row must reproduce) and exits with
// status 1 if one is missed; 2 if the lab could not run.
package main
