package interceptor_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// retryInfoError is a status as a plain grpc-go server sends it, with a
// google.rpc.RetryInfo asking the caller to wait delay before retrying.
func retryInfoError(t *testing.T, code codes.Code, delays ...time.Duration) error {
	t.Helper()
	st := status.New(code, "come back later")
	for _, d := range delays {
		var err error
		st, err = st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
		require.NoError(t, err)
	}
	return st.Err()
}

// TestRetryInfoFromAPlainServer: a server the suite did not write (a plain
// grpc-go server, no stormguard interceptor) answers its first attempt with
// a google.rpc.RetryInfo in the status details. The suite honours it like
// grpc-retry-pushback-ms: the retry waits the delay the server asked for
// (instead of the backoff), and is not sent when the delay does not fit in
// the call's deadline or exceeds MaxPushback.
func TestRetryInfoFromAPlainServer(t *testing.T) {
	for _, tc := range []struct {
		name     string
		code     codes.Code
		delays   []time.Duration
		timeout  time.Duration
		attempts int
		gap      time.Duration // between the two attempts, when there are two
		refused  interceptor.Reason
	}{
		{name: "waits the delay", code: codes.Unavailable, delays: []time.Duration{200 * time.Millisecond}, timeout: 5 * time.Second, attempts: 2, gap: 200 * time.Millisecond},
		{name: "a short delay replaces the backoff", code: codes.Unavailable, delays: []time.Duration{2 * time.Millisecond}, timeout: 5 * time.Second, attempts: 2, gap: 2 * time.Millisecond},
		{name: "zero retries at once", code: codes.Unavailable, delays: []time.Duration{0}, timeout: 5 * time.Second, attempts: 2, gap: 0},
		{name: "two that agree", code: codes.Unavailable, delays: []time.Duration{300 * time.Millisecond, 300 * time.Millisecond}, timeout: 5 * time.Second, attempts: 2, gap: 300 * time.Millisecond},
		{name: "does not fit the deadline", code: codes.Unavailable, delays: []time.Duration{500 * time.Millisecond}, timeout: 300 * time.Millisecond, attempts: 1, refused: interceptor.ReasonDeadline},
		{name: "beyond MaxPushback", code: codes.Unavailable, delays: []time.Duration{interceptor.MaxPushback + time.Second}, timeout: 5 * time.Minute, attempts: 1, refused: interceptor.ReasonPushback},
		{name: "two that disagree", code: codes.Unavailable, delays: []time.Duration{100 * time.Millisecond, 900 * time.Millisecond}, timeout: 5 * time.Second, attempts: 1, refused: interceptor.ReasonPushback},
		{name: "not a retryable code", code: codes.ResourceExhausted, delays: []time.Duration{10 * time.Millisecond}, timeout: 5 * time.Second, attempts: 1, refused: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var at []time.Time
				failFirst := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
					mu.Lock()
					at = append(at, time.Now())
					n := len(at)
					mu.Unlock()
					if n == 1 {
						return nil, retryInfoError(t, tc.code, tc.delays...)
					}
					return h(ctx, req)
				}
				l := origin.Bufconn()
				srv := origin.Serve(l, origin.New(func(origin.Call) origin.Reply { return origin.Reply{} }), grpc.ChainUnaryInterceptor(failFirst))
				defer srv.Stop()
				guard := interceptor.NewClient()
				cc, err := grpc.NewClient(l.Target, l.ConnectOptions(guard.DialOptions()...)...)
				require.NoError(t, err)
				defer cc.Close()

				ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
				defer cancel()
				_, err = echov1.NewEchoServiceClient(cc).Put(ctx, &echov1.PutRequest{RequestId: "r"})
				mu.Lock()
				defer mu.Unlock()
				require.Len(t, at, tc.attempts)
				if tc.attempts == 1 {
					require.Error(t, err)
					assert.Equal(t, tc.code, status.Code(err))
					assert.Equal(t, tc.refused, interceptor.RefusedBy(err))
					return
				}
				require.NoError(t, err)
				assert.Equal(t, tc.gap, at[1].Sub(at[0]), "the retry waits what the server asked")
			})
		})
	}
}
