package interceptor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// keepMessageOnly is what a client library between the suite and its
// caller does when it turns the errors it knows into its own (etcd's
// clientv3 does): it keeps a status's code and message and drops the
// details.
func keepMessageOnly(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err == nil {
		return nil
	}
	st := status.Convert(err)
	return status.Error(st.Code(), st.Message())
}

// ownError is an error type of a client library that keeps only the
// message, like clientv3's rpctypes.EtcdError.
type ownError struct {
	code codes.Code
	desc string
}

func (e ownError) Error() string { return e.desc }

// dialWrapped serves script over bufconn and dials it with wrap installed
// outside the suite's interceptors.
func dialWrapped(t *testing.T, script origin.Script, wrap grpc.UnaryClientInterceptor, opts ...interceptor.ClientOption) (*origin.Origin, echov1.EchoServiceClient) {
	t.Helper()
	o := origin.New(script)
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	guard := interceptor.NewClient(append(append(noopProviders(), fast), opts...)...)
	cc, err := l.Dial(grpc.WithChainUnaryInterceptor(wrap, guard.Unary()), grpc.WithChainStreamInterceptor(guard.Stream()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close(); srv.Stop() })
	return o, echov1.NewEchoServiceClient(cc)
}

// A refusal's reason survives a client that keeps only the status's code
// and message: the message carries a marker RefusedBy reads.
func TestRefusedByThroughClientKeepingOnlyTheMessage(t *testing.T) {
	down := func(c origin.Call) origin.Reply {
		return origin.Reply{Code: codes.Unavailable, Message: "etcdserver: no leader"}
	}
	t.Run("budget", func(t *testing.T) {
		o, c := dialWrapped(t, down, keepMessageOnly, interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())))
		_, err := c.Put(t.Context(), &echov1.PutRequest{RequestId: "x"})
		require.Equal(t, 1, o.Total(), "one deposit at 10% funds no retry and there is no floor")
		st := status.Convert(err)
		assert.Equal(t, codes.Unavailable, st.Code())
		assert.Empty(t, st.Details(), "the wrapper dropped the details")
		assert.Equal(t, "etcdserver: no leader [stormguard: retry refused: budget]", st.Message())
		assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedBy(err))
		// A library error type that keeps only the message.
		assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedBy(ownError{st.Code(), st.Message()}))
	})
	t.Run("breaker", func(t *testing.T) {
		_, c := dialWrapped(t, down, keepMessageOnly, interceptor.WithBudget(nil),
			interceptor.WithBreaker(&breaker.Config{MinAttempts: 3}))
		_, err := c.Put(t.Context(), &echov1.PutRequest{RequestId: "a"}) // three failed attempts open it
		require.Equal(t, codes.Unavailable, status.Code(err))
		_, err = c.Put(t.Context(), &echov1.PutRequest{RequestId: "b"})
		st := status.Convert(err)
		assert.Empty(t, st.Details())
		assert.Contains(t, st.Message(), "stormguard: circuit breaker open for ")
		assert.Equal(t, interceptor.ReasonBreaker, interceptor.RefusedBy(err))
	})
	t.Run("without marker", func(t *testing.T) {
		_, c := dialWrapped(t, down, keepMessageOnly, interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())), interceptor.WithoutRefusalMarker())
		_, err := c.Put(t.Context(), &echov1.PutRequest{RequestId: "x"})
		assert.Equal(t, "etcdserver: no leader", status.Convert(err).Message(), "the message as the server sent it")
		assert.Equal(t, interceptor.Reason(""), interceptor.RefusedBy(err), "nothing left to read")
	})
	t.Run("no wrapper", func(t *testing.T) {
		pass := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		_, c := dialWrapped(t, down, pass, interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())), interceptor.WithoutRefusalMarker())
		_, err := c.Put(t.Context(), &echov1.PutRequest{RequestId: "x"})
		assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedBy(err), "the details")
	})
}

// A message RefusedBy reads: the last marker counts, and only a known
// reason that annotates.
func TestRefusedByMessageMarker(t *testing.T) {
	for msg, want := range map[string]interceptor.Reason{
		"down [stormguard: retry refused: budget]":                                     interceptor.ReasonBudget,
		"down [stormguard: retry refused: pushback]":                                   interceptor.ReasonPushback,
		"down [stormguard: retry refused: deadline]":                                   interceptor.ReasonDeadline,
		"a [stormguard: retry refused: budget] b [stormguard: retry refused: breaker]": interceptor.ReasonBreaker,
		"down [stormguard: retry refused: max_attempts]":                               "",
		"down [stormguard: retry refused: whatever]":                                   "",
		"down [stormguard: retry refused: budget":                                      "",
		"stormguard: circuit breaker open for dns:///db:5432":                          interceptor.ReasonBreaker,
		"handler: downstream: stormguard: circuit breaker open for etcd":               interceptor.ReasonBreaker,
		"down": "",
		"":     "",
	} {
		assert.Equal(t, want, interceptor.RefusedBy(status.Error(codes.Unavailable, msg)), msg)
		assert.Equal(t, want, interceptor.RefusedBy(ownError{codes.Unavailable, msg}), msg)
	}
	assert.Equal(t, interceptor.Reason(""), interceptor.RefusedBy(nil))
}
