// Package stormguardv1 holds the generated Go code of
// stormguard/v1/options.proto: the (stormguard.v1.method) method option and
// its MethodPolicy message, which tune how the stormguard interceptors retry
// and hedge a method.
//
// Regenerate with `go tool -modfile=tools/go.mod buf generate` from the
// repository root.
package stormguardv1
