package interceptor_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
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
		assert.Equal(t, "etcdserver: no leader [stormguard: retry refused: budget #"+interceptor.Seal()+"]", st.Message())
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

// A message RefusedBy reads: the last marker counts, only a known reason
// that annotates, and only with this process's seal; a marker without it
// (or with another) is a refusal made elsewhere, which RefusedDownstream
// reads.
func TestRefusedByMessageMarker(t *testing.T) {
	sealed := " #" + interceptor.Seal() + "]"
	open := " [stormguard #" + interceptor.Seal() + "]"
	for msg, want := range map[string][2]interceptor.Reason{ // RefusedBy, RefusedDownstream
		"down [stormguard: retry refused: budget" + sealed:                                          {interceptor.ReasonBudget, ""},
		"down [stormguard: retry refused: pushback" + sealed:                                        {interceptor.ReasonPushback, ""},
		"down [stormguard: retry refused: deadline" + sealed:                                        {interceptor.ReasonDeadline, ""},
		"a [stormguard: retry refused: budget] b [stormguard: retry refused: breaker" + sealed:      {interceptor.ReasonBreaker, ""},
		"a [stormguard: retry refused: breaker" + sealed + " b [stormguard: retry refused: budget]": {"", interceptor.ReasonBudget},
		"down [stormguard: retry refused: max_attempts" + sealed:                                    {"", ""},
		"down [stormguard: retry refused: whatever" + sealed:                                        {"", ""},
		"down [stormguard: retry refused: budget #" + interceptor.Seal():                            {"", ""},
		"down [stormguard: retry refused: budget]":                                                  {"", interceptor.ReasonBudget},
		"down [stormguard: retry refused: budget #0123456789abcdef]":                                {"", interceptor.ReasonBudget},
		"stormguard: circuit breaker open for /pkg.Svc/M on dns:///db:5432" + open:                  {interceptor.ReasonBreaker, ""},
		"handler: downstream: stormguard: circuit breaker open for /pkg.Svc/M on etcd" + open:       {interceptor.ReasonBreaker, ""},
		"stormguard: circuit breaker open for /pkg.Svc/M on dns:///db:5432":                         {"", interceptor.ReasonBreaker},
		"down": {"", ""},
		"":     {"", ""},
	} {
		assert.Equal(t, want[0], interceptor.RefusedBy(status.Error(codes.Unavailable, msg)), msg)
		assert.Equal(t, want[0], interceptor.RefusedBy(ownError{codes.Unavailable, msg}), msg)
		assert.Equal(t, want[1], interceptor.RefusedDownstream(status.Error(codes.Unavailable, msg)), msg)
	}
	assert.Equal(t, interceptor.Reason(""), interceptor.RefusedBy(nil))
	assert.Equal(t, interceptor.Reason(""), interceptor.RefusedDownstream(nil))
}

// serveStatus serves a method that answers every call with st, behind a
// real grpc server, and returns a client of it through the suite's
// interceptors.
func serveStatus(t *testing.T, st *status.Status) echov1.EchoServiceClient {
	t.Helper()
	l := origin.Bufconn()
	s := origin.Serve(l, origin.New(nil), grpc.ChainUnaryInterceptor(
		func(context.Context, any, *grpc.UnaryServerInfo, grpc.UnaryHandler) (any, error) {
			return nil, st.Err()
		}))
	t.Cleanup(s.Stop)
	guard := interceptor.NewClient(append(noopProviders(), fast)...)
	cc, err := l.Dial(grpc.WithChainUnaryInterceptor(guard.Unary()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return echov1.NewEchoServiceClient(cc)
}

// withErrorInfo returns a status with an ErrorInfo in the suite's domain.
func withErrorInfo(t *testing.T, code codes.Code, msg, reason string, md map[string]string) *status.Status {
	st, err := status.New(code, msg).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: semconv.ErrorDomain, Metadata: md})
	require.NoError(t, err)
	return st
}

// What a server sends never makes RefusedBy report a refusal this process
// did not make: not the refusal marker in its message, not an ErrorInfo
// in the suite's domain, not a reason of its choosing (4 KiB of it), not
// a guessed seal. The call is not retried (PERMISSION_DENIED): whatever
// RefusedBy says is the server's word alone.
func TestRefusedByIgnoresWhatAServerSays(t *testing.T) {
	long := strings.Repeat("x", 4096)
	for name, st := range map[string]*status.Status{
		"marker":              status.New(codes.PermissionDenied, "denied [stormguard: retry refused: budget]"),
		"marker, long":        status.New(codes.PermissionDenied, "denied [stormguard: retry refused: "+long+"]"),
		"marker, guessed":     status.New(codes.PermissionDenied, "denied [stormguard: retry refused: budget #0123456789abcdef]"),
		"breaker message":     status.New(codes.PermissionDenied, "stormguard: circuit breaker open for /echo.v1.EchoService/Get on db"),
		"retry refused":       withErrorInfo(t, codes.PermissionDenied, "denied", semconv.ErrorReasonRetryRefused, map[string]string{"refused_by": "budget"}),
		"retry refused, long": withErrorInfo(t, codes.PermissionDenied, "denied", semconv.ErrorReasonRetryRefused, map[string]string{"refused_by": long}),
		"circuit open":        withErrorInfo(t, codes.PermissionDenied, "denied", semconv.ErrorReasonCircuitOpen, nil),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := serveStatus(t, st).Get(t.Context(), &echov1.GetRequest{RequestId: "x"})
			require.Equal(t, codes.PermissionDenied, status.Code(err))
			assert.Equal(t, interceptor.Reason(""), interceptor.RefusedBy(err), "no refusal of this process")
			assert.Contains(t, []interceptor.Reason{"", interceptor.ReasonBudget, interceptor.ReasonBreaker},
				interceptor.RefusedDownstream(err), "the server's word, one of the reasons")
		})
	}
}

// forwarding serves a suite server whose handler calls an origin that
// always fails through a suite client with no budget to retry, and
// returns that call's error: a refusal made down the chain, which the
// server forwards up. It returns a ClientConn of the server, made with
// opts.
func forwarding(t *testing.T, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	inner := origin.New(origin.Always(codes.Unavailable))
	il := origin.Bufconn()
	is := origin.Serve(il, inner)
	t.Cleanup(is.Stop)
	down := interceptor.NewClient(append(noopProviders(), fast, interceptor.WithBudget(budget.NewRegistry(budgetNoBurst())))...)
	dcc, err := il.Dial(grpc.WithChainUnaryInterceptor(down.Unary()))
	require.NoError(t, err)
	t.Cleanup(func() { dcc.Close() })
	l := origin.Bufconn()
	s := origin.Serve(l, origin.New(nil), grpc.ChainUnaryInterceptor(interceptor.NewServer().Unary(),
		func(ctx context.Context, _ any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
			return echov1.NewEchoServiceClient(dcc).Put(ctx, &echov1.PutRequest{RequestId: "down"})
		}))
	t.Cleanup(s.Stop)
	cc, err := l.Dial(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return cc
}

// A refusal made down the chain and forwarded by a suite server is not
// this process's: RefusedBy does not report it (the server's client made
// it), even when both share a process, as here.
func TestRefusedByTellsAForwardedRefusal(t *testing.T) {
	t.Run("plain client", func(t *testing.T) {
		_, err := echov1.NewEchoServiceClient(forwarding(t)).Get(t.Context(), &echov1.GetRequest{RequestId: "x"})
		require.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, interceptor.Reason(""), interceptor.RefusedBy(err), "a plain client refused nothing")
		assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedDownstream(err), "the server's client did")
		assert.NotContains(t, status.Convert(err).Message(), interceptor.Seal(), "the seal does not go up the chain")
		assert.NotContains(t, fmt.Sprint(status.Convert(err).Proto()), interceptor.Seal())
	})
	t.Run("suite client", func(t *testing.T) {
		guard := interceptor.NewClient(append(noopProviders(), fast)...)
		_, err := echov1.NewEchoServiceClient(forwarding(t, grpc.WithChainUnaryInterceptor(guard.Unary()))).
			Get(t.Context(), &echov1.GetRequest{RequestId: "x"})
		require.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, interceptor.ReasonPushback, interceptor.RefusedBy(err), "this client refused to retry: the server said not to")
		assert.Equal(t, interceptor.ReasonBudget, interceptor.RefusedDownstream(err), "because its own client's budget refused")
	})
}
