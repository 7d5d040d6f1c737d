// Command metrics shows stormguard's metrics in Prometheus.
//
// It starts two demo echo services on 127.0.0.1 ("orders" and "search",
// each behind interceptor.NewServer), calls them through
// interceptor.NewClient with an OpenTelemetry MeterProvider whose reader is
// the OpenTelemetry Prometheus exporter, and serves the exposition on
// /metrics (127.0.0.1:9464 by default) for a Prometheus to scrape.
//
// The traffic is 1,400 ticks of 10 ms, one call to each service per tick:
//
//  1. flaky (ticks 0-299): orders fails the first attempt of every 20th
//     Put, which the suite retries, and every 5th Notify, which it may not
//     retry (unmarked in the proto).
//  2. outage (ticks 300-799): orders fails every attempt. The budget grants
//     about one retry per ten calls; when half the attempts of the last 10 s
//     have failed the breaker opens and calls are refused without being
//     sent.
//  3. recovery (ticks 800-1399): orders answers again; the breaker lets a
//     probe through after its open period, and closes.
//
// search answers every Get, but stalls the first attempt of every 25th for
// 500 ms: adaptive hedging sends a second attempt, which wins.
//
// The budgets and breakers run on a simulated clock that advances 10 ms per
// tick (budget.Config.Now and breaker.Config.Now), so every run makes the
// same decisions however fast the machine is; -realtime runs them on the
// wall clock and paces the ticks instead. Call durations are always measured
// on the wall clock.
//
// When the traffic is done, it prints what each phase did and keeps serving
// /metrics until interrupted (-exit: exit at once).
//
// Try it (with scripts/prometheus.sh, which runs Prometheus on loopback):
//
//	bash scripts/prometheus.sh start
//	go -C examples/metrics run .
package main
