package interceptor_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/semconv"
)

// grpcRetryConfig is the service config of grpc-go's retry tests
// (test/retry_test.go), for the demo service: a retryPolicy of 4 attempts
// on UNAVAILABLE, with millisecond backoffs.
const grpcRetryConfig = `{"methodConfig":[{"name":[{"service":"echo.v1.EchoService"}],
  "retryPolicy":{"maxAttempts":4,"initialBackoff":"0.001s","maxBackoff":"0.001s","backoffMultiplier":1,"retryableStatusCodes":["UNAVAILABLE"]}}]}`

// scriptedFailures fails the first n attempts of a request whose id is
// "<n>-<code>-<anything>" with that code (UNAVAILABLE: "u", INTERNAL:
// "i"), as grpc-go's retry tests script their server.
func scriptedFailures(c origin.Call) origin.Reply {
	var n int
	var code string
	if _, err := fmt.Sscanf(strings.ReplaceAll(c.RequestID, "-", " "), "%d %s", &n, &code); err != nil || c.Attempt > n {
		return origin.Reply{}
	}
	cd := codes.Unavailable
	if code == "i" {
		cd = codes.Internal
	}
	return origin.Reply{Code: cd, Message: fmt.Sprintf("scripted failure %d of %s", c.Attempt, c.RequestID)}
}

// retryCase is one call of the ported tests: a request's scripted
// failures, and, per install, the code it ends with and the attempts the
// server saw.
type retryCase struct {
	id string
	// As the suite's own options say (3 attempts: by hand, grpc-go's
	// retries off), and as the retryPolicy says (4 attempts: carried out by
	// grpc-go, or, through DialOptions, by the suite).
	offCode, onCode         codes.Code
	offAttempts, onAttempts int
}

// The cases of grpc-go's TestRetryUnary, on the suite's codes: successes,
// retryable failures that a retry rescues, a non-retryable failure, and
// failures past every attempt.
var retryCases = []retryCase{
	{"0-u-a", codes.OK, codes.OK, 1, 1},
	{"1-u-b", codes.OK, codes.OK, 2, 2},
	{"2-u-c", codes.OK, codes.OK, 3, 3},
	{"1-i-d", codes.Internal, codes.Internal, 1, 1},
	{"3-u-e", codes.Unavailable, codes.OK, 3, 4},
	{"9-u-f", codes.Unavailable, codes.Unavailable, 3, 4},
	{"1-u-g", codes.OK, codes.OK, 2, 2},
}

// grpc-go's retry tests ported onto the suite installed three ways, with
// a service config retryPolicy: with DialOptions (grpc-go's retries off:
// the suite carries the retryPolicy out, 4 attempts, as grpc-go alone
// would), by hand with grpc.WithDisableRetry (off too: the suite retries
// as its own options say, 3 attempts; installed by hand it leaves a
// retryPolicy to grpc-go, whose retries are off here), and by hand without
// it (grpc-go's retries on). On, grpc-go retries and the suite does not:
// the server sees what it sees from grpc-go alone, nothing multiplied.
func TestGRPCRetryTestsByHand(t *testing.T) {
	installs := []struct {
		name   string
		off    bool // the suite's own options decide, not the retryPolicy
		dialed func(guard *interceptor.Client) []grpc.DialOption
	}{
		{"DialOptions", false, func(g *interceptor.Client) []grpc.DialOption { return g.DialOptions() }},
		{"by hand, WithDisableRetry", true, func(g *interceptor.Client) []grpc.DialOption {
			return []grpc.DialOption{grpc.WithDisableRetry(), grpc.WithChainUnaryInterceptor(g.Unary()), grpc.WithChainStreamInterceptor(g.Stream())}
		}},
		{"by hand, grpc-go's retries on", false, func(g *interceptor.Client) []grpc.DialOption {
			return []grpc.DialOption{grpc.WithChainUnaryInterceptor(g.Unary()), grpc.WithChainStreamInterceptor(g.Stream())}
		}},
		{"grpc-go alone (control)", false, func(*interceptor.Client) []grpc.DialOption { return nil }},
	}
	for _, in := range installs {
		t.Run(in.name, func(t *testing.T) {
			o := origin.New(scriptedFailures)
			l := origin.Bufconn()
			defer origin.Serve(l, o).Stop()
			guard := interceptor.NewClient(append(noopProviders(), fast, interceptor.WithBudget(nil))...)
			cc, err := grpc.NewClient(l.Target, l.ConnectOptions(append([]grpc.DialOption{grpc.WithDefaultServiceConfig(grpcRetryConfig)}, in.dialed(guard)...)...)...)
			require.NoError(t, err)
			defer cc.Close()
			echo := echov1.NewEchoServiceClient(cc)
			failed := 0
			for _, tc := range retryCases {
				wantCode, wantAttempts := tc.onCode, tc.onAttempts
				if in.off {
					wantCode, wantAttempts = tc.offCode, tc.offAttempts
				}
				_, err := echo.Put(t.Context(), &echov1.PutRequest{RequestId: tc.id})
				got := o.CountID(put, tc.id)
				if status.Code(err) != wantCode || got != wantAttempts {
					failed++
					t.Errorf("Put %s: %v after %d attempts; want %v after %d", tc.id, status.Code(err), got, wantCode, wantAttempts)
				}
			}
			// TestRetryStreaming's simplest case: a server stream that fails
			// before its first message is retried.
			for _, id := range []string{"1-u-s", "2-u-t"} {
				want := 2
				if id == "2-u-t" {
					want = 3
				}
				s, err := echo.List(t.Context(), &echov1.ListRequest{RequestId: id, Count: 2})
				require.NoError(t, err)
				n := 0
				for {
					if _, err = s.Recv(); err != nil {
						break
					}
					n++
				}
				if err != io.EOF || n != 2 || o.CountID(list, id) != want {
					failed++
					t.Errorf("List %s: %d messages, then %v, after %d attempts; want 2, EOF, %d", id, n, err, o.CountID(list, id), want)
				}
			}
			// A fresh ClientConn whose first call fails: the call runs
			// before grpc has the service config.
			cc2, err := grpc.NewClient(l.Target, l.ConnectOptions(append([]grpc.DialOption{grpc.WithDefaultServiceConfig(grpcRetryConfig)}, in.dialed(guard)...)...)...)
			require.NoError(t, err)
			defer cc2.Close()
			_, err = echov1.NewEchoServiceClient(cc2).Put(t.Context(), &echov1.PutRequest{RequestId: "1-u-first"})
			if status.Code(err) != codes.OK || o.CountID(put, "1-u-first") != 2 {
				failed++
				t.Errorf("a fresh ClientConn's first Put: %v after %d attempts; want OK after 2", err, o.CountID(put, "1-u-first"))
			}
			// And one whose first call is a stream that fails.
			cc3, err := grpc.NewClient(l.Target, l.ConnectOptions(append([]grpc.DialOption{grpc.WithDefaultServiceConfig(grpcRetryConfig)}, in.dialed(guard)...)...)...)
			require.NoError(t, err)
			defer cc3.Close()
			s, err := echov1.NewEchoServiceClient(cc3).List(t.Context(), &echov1.ListRequest{RequestId: "1-u-firststream", Count: 1})
			require.NoError(t, err)
			if _, err = s.Recv(); err != nil || o.CountID(list, "1-u-firststream") != 2 {
				failed++
				t.Errorf("a fresh ClientConn's first List: %v after %d attempts; want a message after 2", err, o.CountID(list, "1-u-firststream"))
			}
			t.Logf("%s: %d of %d calls not as grpc-go's retry tests want", in.name, failed, len(retryCases)+4)
		})
	}
}

const retryPolicy = `{"methodConfig":[{"name":[{"service":"echo.v1.EchoService"}],
  "retryPolicy":{"maxAttempts":3,"initialBackoff":"0.001s","maxBackoff":"0.002s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`

// Forgetting grpc.WithDisableRetry with a service config retryPolicy made a
// dead origin see 6 attempts for one call (9 without the budget). The suite
// notices the policy, sends one attempt of its own (grpc-go retries it), and
// says so once in the log and on every call span. DialOptions disables
// grpc-go's retries, and the suite retries.
func TestGRPCRetryPolicyIsNotMultiplied(t *testing.T) {
	var logs bytes.Buffer
	o := origin.New(origin.Always(codes.Unavailable))
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	guard := interceptor.NewClient(fast, interceptor.WithBudget(nil), interceptor.WithBreaker(nil), interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tp}),
		interceptor.WithTelemetry(interceptor.Telemetry{Logger: slog.New(slog.NewTextHandler(&logs, nil))}))
	// grpc-go's retries left on: ConnectOptions does not disable them.
	cc, err := grpc.NewClient(l.Target, l.ConnectOptions(grpc.WithDefaultServiceConfig(retryPolicy), grpc.WithChainUnaryInterceptor(guard.Unary()))...)
	require.NoError(t, err)
	defer cc.Close()
	for _, id := range []string{"a", "b"} {
		_, err = echov1.NewEchoServiceClient(cc).Put(t.Context(), &echov1.PutRequest{RequestId: id})
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Equal(t, 3, o.CountID(put, id), "grpc-go's 3 attempts, not 3×3")
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "retryPolicy"), "reported once: %s", logs.String())
	last := spans.GetSpans()[len(spans.GetSpans())-1]
	assert.Contains(t, last.Attributes, semconv.AttrGRPCRetryPolicy.Bool(true))

	// Through DialOptions, grpc-go does not retry, and the suite does.
	guard = interceptor.NewClient(fast, interceptor.WithBudget(nil), interceptor.WithBreaker(nil), interceptor.WithTelemetry(interceptor.Telemetry{TracerProvider: tp}))
	cc2, err := grpc.NewClient(l.Target, l.ConnectOptions(append([]grpc.DialOption{grpc.WithDefaultServiceConfig(retryPolicy)}, guard.DialOptions()...)...)...)
	require.NoError(t, err)
	defer cc2.Close()
	_, err = echov1.NewEchoServiceClient(cc2).Put(t.Context(), &echov1.PutRequest{RequestId: "c"})
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 3, o.CountID(put, "c"), "the suite's 3 attempts")
}

// refusingServer is grpc-go's test HTTP/2 server (test/end2end_test.go's
// httpServer), as its TestRetryStats uses it: it answers the streams of
// one connection from a script of raw responses, in turn, after refusing
// the streams refuse names with RST_STREAM REFUSED_STREAM, which grpc-go
// retries transparently (gRFC A6: the server never saw them), whether its
// own retries are on or off. No grpc server can be made to refuse a given
// stream on purpose; servers do it when they restart or shed connections.
type refusingServer struct {
	refuse    func(streamID uint32) bool
	responses [][][]string // per stream answered: header blocks, the last one ending the stream
	payload   []bool       // per stream answered: a 0-byte message after its first block
}

func (s *refusingServer) serve(t *testing.T, lis net.Listener) {
	go func() {
		conn, err := lis.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		if _, err = io.ReadFull(conn, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		w := bufio.NewWriter(conn)
		fr := http2.NewFramer(w, bufio.NewReader(conn))
		if fr.WriteSettingsAck() != nil || w.Flush() != nil {
			return
		}
		for n := 0; ; n = (n + 1) % len(s.responses) {
			sid, err := s.nextStream(fr, w)
			if err != nil {
				return
			}
			blocks := s.responses[n]
			for i, block := range blocks {
				var buf bytes.Buffer
				enc := hpack.NewEncoder(&buf)
				for j := 0; j+1 < len(block); j += 2 {
					_ = enc.WriteField(hpack.HeaderField{Name: block[j], Value: block[j+1]})
				}
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: sid, BlockFragment: buf.Bytes(), EndStream: i == len(blocks)-1, EndHeaders: true})
				if i == 0 && s.payload[n] {
					_ = fr.WriteData(sid, false, []byte{0, 0, 0, 0, 0})
				}
				_ = w.Flush()
			}
		}
	}()
}

// nextStream reads frames until a stream's request has ended, refuses it
// if s.refuse says so, and returns the first one it does not refuse.
func (s *refusingServer) nextStream(fr *http2.Framer, w *bufio.Writer) (uint32, error) {
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return 0, err
		}
		switch f.(type) {
		case *http2.HeadersFrame, *http2.DataFrame:
			if !f.Header().Flags.Has(http2.FlagDataEndStream) {
				continue // FlagHeadersEndStream is the same bit
			}
		default:
			continue
		}
		sid := f.Header().StreamID
		if s.refuse == nil || !s.refuse(sid) {
			return sid, nil
		}
		_ = fr.WriteRSTStream(sid, http2.ErrCodeRefusedStream)
		_ = w.Flush()
	}
}

// grpc-go's TestRetryStats, ported onto the README's by-hand install
// (grpc.WithDisableRetry, guard.Unary()): the server refuses the first
// stream (REFUSED_STREAM: grpc-go retries it transparently, its own
// retries off or on), then answers UNAVAILABLE with a 10 ms pushback, then
// OK. grpc-go's transparent retry is not one of its retries: the suite,
// which retries when grpc-go's retries are off, retries after 10 ms and
// the call succeeds, as through DialOptions and as grpc-go alone with its
// retries on.
func TestGRPCRetryStatsByHand(t *testing.T) {
	const cfg = `{"methodConfig": [{"name": [{"service": "echo.v1.EchoService"}],
	  "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.01s",
	    "backoffMultiplier": 1.0, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`
	for name, dial := range map[string]func(g *interceptor.Client) []grpc.DialOption{
		"by hand": func(g *interceptor.Client) []grpc.DialOption {
			return []grpc.DialOption{grpc.WithDisableRetry(), grpc.WithChainUnaryInterceptor(g.Unary()), grpc.WithChainStreamInterceptor(g.Stream())}
		},
		"DialOptions":               func(g *interceptor.Client) []grpc.DialOption { return g.DialOptions() },
		"grpc-go alone, retries on": func(*interceptor.Client) []grpc.DialOption { return nil },
	} {
		t.Run(name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			defer lis.Close()
			srv := &refusingServer{
				refuse: func(sid uint32) bool { return sid == 1 },
				responses: [][][]string{
					{{":status", "200", "content-type", "application/grpc", "grpc-status", "14",
						"grpc-message", "unavailable retry", "grpc-retry-pushback-ms", "10"}},
					{{":status", "200", "content-type", "application/grpc"}, {"grpc-status", "0"}},
				},
				payload: []bool{false, true},
			}
			srv.serve(t, lis)
			guard := interceptor.NewClient(append(noopProviders(), fast)...)
			cc, err := grpc.NewClient(lis.Addr().String(), append([]grpc.DialOption{
				grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithDefaultServiceConfig(cfg)}, dial(guard)...)...)
			require.NoError(t, err)
			defer cc.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			_, err = echov1.NewEchoServiceClient(cc).Put(ctx, &echov1.PutRequest{RequestId: "r"})
			assert.NoError(t, err, "refused, then unavailable with a pushback, then OK")
		})
	}
}
