// Package svcconfig reads what a gRPC service config says about retries
// (gRFC A6: a method's retryPolicy or hedgingPolicy, the channel's
// retryThrottling), which grpc-go keeps to itself, and watches the service
// config a ClientConn's resolver gives it, so that the suite carries the
// operator's policy out, and follows it when it changes at run time.
//
// grpc-go parses a service config's retryPolicy (capping maxAttempts at
// its own limit) and ignores its hedgingPolicy; its retryThrottling is not
// readable from outside grpc. A resolver hands the service config's JSON
// to grpc through resolver.ClientConn.ParseServiceConfig (DNS TXT records,
// xDS, a manual resolver), so Watch wraps the resolvers of a ClientConn and
// reads the JSON there.
package svcconfig
