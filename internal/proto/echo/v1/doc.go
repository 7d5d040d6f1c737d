// Package echov1 holds the generated Go code of the demo EchoService
// (echo/v1/echo.proto), which has one method per policy the stormguard
// interceptors distinguish. Tests, examples and the storm lab use it.
//
// Regenerate with `go tool -modfile=tools/go.mod buf generate` from the
// repository root.
package echov1
