package dedupe_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// sessionOrigin is a payment service that opens a session per execution
// and says so in a response header, as a service might with a cookie: a
// caller that receives another execution's header has been handed
// another caller's session.
func sessionOrigin() *origin.Origin {
	return origin.New(func(c origin.Call) origin.Reply {
		return origin.Reply{Header: metadata.Pairs("x-session", "session-"+strconv.FormatInt(c.Seq, 10))}
	})
}

// charged is what one Charge call received.
type charged struct {
	resp    *echov1.ChargeResponse
	session []string
	err     error
}

func charge(ctx context.Context, c echov1.EchoServiceClient, req *echov1.ChargeRequest) charged {
	var h metadata.MD
	resp, err := c.Charge(ctx, req, grpc.Header(&h))
	return charged{resp: resp, session: h.Get("x-session"), err: err}
}

// serveDefaults serves o with interceptor.NewServer() as it comes, and
// serverOpts.
func serveDefaults(t *testing.T, o *origin.Origin, serverOpts ...grpc.ServerOption) *origin.Listener {
	t.Helper()
	guard := interceptor.NewServer()
	l := origin.Bufconn()
	srv := origin.Serve(l, o, append(serverOpts,
		grpc.ChainUnaryInterceptor(guard.Unary()), grpc.ChainStreamInterceptor(guard.Stream()))...)
	t.Cleanup(srv.Stop)
	return l
}

func dialClient(t *testing.T, l *origin.Listener, opts ...grpc.DialOption) echov1.EchoServiceClient {
	t.Helper()
	cc, err := grpc.NewClient(l.Target, l.ConnectOptions(append([]grpc.DialOption{grpc.WithDisableRetry()}, opts...)...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return echov1.NewEchoServiceClient(cc)
}
