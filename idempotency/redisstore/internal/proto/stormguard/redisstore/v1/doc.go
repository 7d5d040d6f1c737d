// Package redisstorev1 holds the generated Go code of
// stormguard/redisstore/v1/record.proto: the Record message in which the
// Redis idempotency store keeps an executed request's outcome.
//
// Regenerate with `go tool -modfile=tools/go.mod buf generate` from the
// repository root.
package redisstorev1
