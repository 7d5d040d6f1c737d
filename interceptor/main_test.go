package interceptor_test

import (
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/stormguard/stormguard/interceptor"
)

// manualResolvers are manual resolvers registered for the tests that give
// a ClientConn service configs at run time, one per test, each under a
// scheme of its own that DialOptions wraps as it wraps dns's.
var manualResolvers = map[string]*manual.Resolver{}

func TestMain(m *testing.M) {
	for _, scheme := range []string{"sgtest-follow", "sgtest-throttle", "sgtest-hedge"} {
		r := manual.NewBuilderWithScheme(scheme)
		resolver.Register(r)
		interceptor.WrapResolverScheme(scheme)
		manualResolvers[scheme] = r
	}
	goleak.VerifyTestMain(m)
}
