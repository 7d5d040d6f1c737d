// Package outlier is a grpc-go load-balancing policy that ejects an endpoint
// whose failures stand out from the other endpoints', in the style of gRFC
// A50 outlier detection and Finagle's failure accrual, and lets a retry
// avoid the endpoint its previous attempt failed on.
//
// Importing the package registers the policy under [Name]. A client names it
// in its service config, which [ServiceConfig] writes and [DialOption]
// installs:
//
//	conn, err := grpc.NewClient("dns:///payments:443",
//	    grpc.WithTransportCredentials(creds),
//	    outlier.DialOption(outlier.Config{}), // round_robin, with ejection
//	)
//
// The policy wraps a child policy (round_robin by default), counts the
// outcome of every RPC per endpoint through the picker's Done callback,
// and every Config.Interval, or as soon as an endpoint has collected
// enough new failures, compares each endpoint with the rest. An endpoint
// is ejected only when its failure ratio is at least Config.FailureRatio
// over at least Config.MinRequests requests, at least 0.2 above the ratio
// of the other endpoints together, and significantly so (a one-sided
// Fisher exact test at 10⁻⁶): failures spread evenly over the endpoints,
// however many, eject nothing. The child is told an ejected endpoint is in
// TRANSIENT_FAILURE, so it stops picking it, until the ejection time
// (Config.BaseEjectionTime × times ejected, at most Config.MaxEjectionTime)
// has passed. At most Config.MaxEjectionPercent of the endpoints (but
// always one of two) are ejected at once, never the last endpoint that is
// connected, and ejected endpoints return at once when no other endpoint
// is connected.
//
// [AvoidContext] marks addresses that one RPC attempt should not be sent
// to (Envoy's previous_hosts retry predicate): the picker asks the child
// for another endpoint, a bounded number of times, when it returns an
// avoided or ejected one.
//
// The policy counts its ejections, and the outliers it may not eject, with
// gRFC A91's OpenTelemetry counters, on the MeterProvider [SetMeterProvider]
// sets (the global one by default).
//
// The policy uses grpc-go's public balancer API only. Ejection reaches
// children that watch their endpoints' health, as grpc-go's round_robin,
// weighted_round_robin and least_request do (pick_first leaves under
// endpointsharding); with pick_first as the child, nothing is ejected and
// the policy only counts.
package outlier
