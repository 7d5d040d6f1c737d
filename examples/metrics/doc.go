// Command metrics shows stormguard's metrics in Prometheus.
//
// It starts two demo echo services on 127.0.0.1 ("orders" and "search",
// each behind interceptor.NewServer), calls them through one
// interceptor.NewClient with its defaults (dialed with Client.DialOptions)
// and an OpenTelemetry MeterProvider whose reader is the OpenTelemetry
// Prometheus exporter, and serves the exposition on /metrics
// (127.0.0.1:9464 by default) for a Prometheus to scrape.
//
// The traffic is 2,400 ticks of 10 ms, one call to each service per tick:
//
//  1. flaky (ticks 0-299): orders fails the first attempt of every 20th
//     Put, which the suite retries, and every 5th Notify, which it may not
//     retry (unmarked in the proto: not_idempotent).
//  2. outage (ticks 300-1699, 14 s): orders fails every attempt. For
//     3 s the target's recent window (the last 3 to 4 s) still holds the
//     flaky phase's successes, so every call is sent and the budget pays
//     for the retries: its credit and its loan first (two retries each
//     for six Puts, then max_attempts), then a tenth of the calls,
//     refusing the rest (budget). Then the target has served nothing lately: retries are
//     refused (breaker), first attempts still sent. Once a method's
//     breaker finds failures only in its own 10 s window (Notify's at tick
//     1200, Put's at 1201) it opens, and that method's calls are refused
//     without being sent (breaker); its probes after 1 s and 2 s (plus
//     jitter) fail, and it opens for 4 s, the longest.
//  3. recovery (ticks 1700-2399): orders answers again; each breaker, still
//     open, refuses its method's calls until its probe finds orders back
//     (ticks 1980 and 1984), and closes.
//
// search answers every Get, but stalls the first attempt of every 25th for
// 500 ms: adaptive hedging sends a second attempt, which wins.
//
// Then two incidents run on the wall clock (incidents.go): a ledger of
// three replicas behind the outlier policy, one dead, whose failures a
// second Client retries after real backoffs (grpc.client.call.retry_delay)
// until the policy ejects it (grpc.lb.outlier_detection.ejections_enforced);
// and a vault whose Server refuses doomed, shed, dedupe_busy and
// retry_budget calls from a plain grpc-go client
// (stormguard.server.refusals).
//
// The Client runs on a simulated clock (through internal/clock's seam,
// which the suite keeps for the repository's simulators) that advances 10
// ms per tick and stands still while orders is
// called, so every run makes the same decisions on orders however fast the
// machine is (the breakers' jitter is seeded, internal/breakerrand); orders'
// calls then take no time, backoffs included. While search is called it
// runs with the wall clock (never into the next tick), so that search's
// latencies, and the hedging delay learned from them, are real. On that
// clock calls carry no deadline: a context's deadline is a wall-clock
// instant. -realtime runs the Client on the wall clock, paces the ticks
// 10 ms apart, and gives each call a 5 s deadline.
//
// When the traffic is done, it prints what each phase did (calls, attempts,
// refusals by reason with their first and last ticks, as Hooks.OnRefusal
// reports them) and the breakers' changes (Hooks.OnBreakerChange); then
// what the incidents did, and keeps serving /metrics until interrupted
// (-exit: exit at once).
//
// Try it (with scripts/prometheus.sh, which runs Prometheus on loopback):
//
//	bash scripts/prometheus.sh start
//	go -C examples/metrics run .
package main
