// Command stormlab reruns the retry-storm scenarios of the seed articles on
// this machine, with real gRPC servers and clients on 127.0.0.1, and prints
// how many requests reached the origin under each client policy.
//
// This first version measures the baseline rows of the one-hop outage
// scenario: no retries, and three attempts per call with nothing to bound
// them. The suite's rows arrive with the interceptor package.
package main
