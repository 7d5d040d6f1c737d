package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
)

// requestLog prints one line per request, serialised.
type requestLog struct {
	mu  sync.Mutex
	out io.Writer
}

func newLog(out io.Writer) *requestLog { return &requestLog{out: out} }

func (l *requestLog) printf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.out, format+"\n", args...)
}

// describe says what arrived: the attempt (from
// grpc-previous-rpc-attempts), the deadline, the idempotency key.
func describe(ctx context.Context, method string, req any) string {
	var b strings.Builder
	b.WriteString(strings.TrimPrefix(method, "/echo.v1.EchoService/"))
	if r, ok := req.(interface{ GetRequestId() string }); ok {
		fmt.Fprintf(&b, " request_id=%q", r.GetRequestId())
	}
	attempt := "1"
	if vs := metadata.ValueFromIncomingContext(ctx, semconv.PreviousAttemptsKey); len(vs) == 1 {
		attempt = fmt.Sprintf("? (%s=%q)", semconv.PreviousAttemptsKey, vs[0])
		if n, err := strconv.Atoi(vs[0]); err == nil && n >= 0 {
			attempt = strconv.Itoa(n + 1)
		}
	}
	fmt.Fprintf(&b, " attempt=%s", attempt)
	if d, ok := ctx.Deadline(); ok {
		fmt.Fprintf(&b, " deadline=%v", time.Until(d).Round(time.Millisecond))
	}
	if vs := metadata.ValueFromIncomingContext(ctx, deadline.MetadataKey); len(vs) == 1 {
		fmt.Fprintf(&b, " %s=%s", deadline.MetadataKey, vs[0])
	}
	if vs := metadata.ValueFromIncomingContext(ctx, idempotency.MetadataKey); len(vs) == 1 {
		fmt.Fprintf(&b, " key=%s", vs[0])
	}
	return b.String()
}

func outcome(err error) string {
	if err == nil {
		return "OK"
	}
	st := status.Convert(err)
	return st.Code().String() + ": " + st.Message()
}

func (l *requestLog) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	what := describe(ctx, info.FullMethod, req)
	resp, err := h(ctx, req)
	l.printf("%s → %s", what, outcome(err))
	return resp, err
}

func (l *requestLog) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	what := describe(ss.Context(), info.FullMethod, nil)
	err := h(srv, ss)
	l.printf("%s (stream) → %s", what, outcome(err))
	return err
}

// flakyUnary fails the first attempt of every n-th unary request with
// Unavailable (n ≤ 0: never). A retry carries grpc-previous-rpc-attempts
// and is let through.
func flakyUnary(n int) grpc.UnaryServerInterceptor {
	var firsts atomic.Int64
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if n > 0 && len(metadata.ValueFromIncomingContext(ctx, semconv.PreviousAttemptsKey)) == 0 &&
			firsts.Add(1)%int64(n) == 0 {
			return nil, status.Errorf(codes.Unavailable, "server: -flaky %d: this first attempt fails", n)
		}
		return h(ctx, req)
	}
}
