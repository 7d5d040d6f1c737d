// Package compare benchmarks stormguard's client interceptor against the
// retry libraries Go gRPC clients use today. See README.md.
package compare
