// Package origin is a programmable gRPC server for the demo EchoService,
// used by stormguard's tests, examples and storm lab to play a dependency
// that fails, stalls or recovers on cue.
//
// An [Origin] counts every attempt that reaches it, per method and per
// request id (the request_id field every demo request carries), and answers
// each attempt as its [Script] says: succeed, fail with a code, fail the
// first N attempts of a request, sleep, set trailers such as
// grpc-retry-pushback-ms, or fail a stream after N messages. A [Hop]
// forwards every call to another EchoService, to build chains of services.
//
// [Bufconn] and [TCP] serve a grpc.Server in memory or on 127.0.0.1:0.
package origin
