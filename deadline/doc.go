// Package deadline carries the caller's deadline down a chain of gRPC
// services, so that nobody works for a caller who left.
//
// A deadline protects the caller; propagated, it also protects the
// dependency, which can stop work nobody waits for. The context deadline is
// the primary carrier: grpc sends it as grpc-timeout. This package adds,
// on both sides of a call:
//
//   - A [Client] (unary and stream client interceptors, and the building
//     blocks [Client.CallContext] and [Client.AttemptContext] for a
//     composed interceptor that retries) fails an attempt fast, with
//     codes.DeadlineExceeded and nothing sent, when less than a minimum is
//     left; gives calls without a deadline an optional default one; and
//     writes the time left, less an optional margin, into the
//     [MetadataKey] ("stormguard-deadline-ms") request header. Each attempt
//     writes the time actually left when it is sent, replacing any value
//     already in the outgoing metadata.
//   - A [Server] (unary and stream server interceptors, and the building
//     block [Server.Apply]) gives the handler the tighter of grpc-timeout
//     and the header, and answers DeadlineExceeded without running the
//     handler when that deadline has passed on arrival. [Remaining] tells a
//     handler how much of its budget is left.
//
// # Wire format
//
// The header value is a plain non-negative decimal count of whole
// milliseconds left when the attempt was sent, rounded down: "250"; a
// positive time under a millisecond is written "1", so that "0" always
// means that no time was left (the server refuses it). It is
// relative, like grpc-timeout, so the clocks of client and server need not
// agree. A value that is not 1 to 10 ASCII digits (signs, spaces, units,
// fractions), or a header with several values, is ignored, and the
// grpc-timeout deadline alone applies; the server counts it as
// [ServerStats].Malformed. Values above [MaxHeader] (30 days) are clamped
// to it.
//
// The header is for servers behind proxies that cap, drop or rewrite
// grpc-timeout (a proxy that forwards with a fresh deadline but copies the
// request metadata), and for logs.
//
// # Margin
//
// [ClientConfig].Margin and MarginFraction shrink only the value written
// into the header, never the attempt's own context deadline (and so never
// grpc-timeout). A stormguard server downstream then gives up first and
// answers DeadlineExceeded while its caller still has the margin left to
// receive that answer. In a chain, margins add up hop by hop.
//
// The margin never takes more than [MaxMarginShare] (a quarter) of the
// time left, and Margin and MarginFraction together never more than
// [MaxMarginFraction]. With the default margin, a call with a few
// milliseconds left is sent with three quarters of them rather than
// refused downstream as expired, so that a call plain grpc-go would
// complete in time completes through stormguard too.
//
// The header is relative (time left when it is written), so without a
// margin each hop's deadline lands later than its caller's by the time
// between the header's writing and the server's reading it. The default
// margin, [DefaultMargin] (5 ms), covers that: over three hops on loopback
// no handler saw a deadline later than the original caller's, also under
// the race detector on a loaded 2-core machine, where a hop took up to
// 2.5 ms. A negative Margin sends the time left as it is.
//
// # Usage
//
//	dc := deadline.NewClient(deadline.ClientConfig{Margin: 10 * time.Millisecond})
//	conn, err := grpc.NewClient(addr, creds,
//		grpc.WithChainUnaryInterceptor(dc.Unary()),
//		grpc.WithChainStreamInterceptor(dc.Stream()),
//	)
//
//	ds := deadline.NewServer(deadline.ServerConfig{})
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(ds.Unary()), // first, so it runs on arrival
//		grpc.ChainStreamInterceptor(ds.Stream()),
//	)
//
// A handler that calls on forwards its own context: its deadline, already
// tightened, travels on.
package deadline
