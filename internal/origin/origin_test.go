package origin_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func start(t *testing.T, l *origin.Listener, svc origin.Registerer) echov1.EchoServiceClient {
	t.Helper()
	srv := origin.Serve(l, svc)
	cc, err := l.Dial()
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close(); srv.Stop() })
	return echov1.NewEchoServiceClient(cc)
}

func TestScriptsAndCounts(t *testing.T) {
	for name, l := range map[string]func() *origin.Listener{
		"bufconn": origin.Bufconn,
		"tcp":     func() *origin.Listener { l, err := origin.TCP(); require.NoError(t, err); return l },
	} {
		t.Run(name, func(t *testing.T) {
			o := origin.New(origin.FailFirst(2, codes.Unavailable))
			c := start(t, l(), o)
			ctx := context.Background()
			for i := 1; i <= 3; i++ {
				_, err := c.Get(ctx, &echov1.GetRequest{RequestId: "a", Key: "k"})
				if i <= 2 {
					assert.Equal(t, codes.Unavailable, status.Code(err), "attempt %d", i)
				} else {
					assert.NoError(t, err)
				}
			}
			_, err := c.Get(ctx, &echov1.GetRequest{RequestId: "b"})
			assert.Equal(t, codes.Unavailable, status.Code(err))
			assert.Equal(t, 3, o.CountID(echov1.EchoService_Get_FullMethodName, "a"))
			assert.Equal(t, 1, o.CountID(echov1.EchoService_Get_FullMethodName, "b"))
			assert.Equal(t, 4, o.Count(echov1.EchoService_Get_FullMethodName))
			assert.Equal(t, 4, o.Total())
			calls := o.Calls()
			require.Len(t, calls, 4)
			assert.Equal(t, 3, calls[2].Attempt)
			assert.Equal(t, int64(4), calls[3].Seq)
		})
	}
}

func TestTrailersDelayAndWasted(t *testing.T) {
	o := origin.New(func(c origin.Call) origin.Reply {
		if c.RequestID == "slow" {
			return origin.Reply{Delay: 300 * time.Millisecond, IgnoreCancel: true}
		}
		return origin.Reply{Code: codes.Unavailable, Trailer: metadata.Pairs("grpc-retry-pushback-ms", "-1")}
	})
	c := start(t, origin.Bufconn(), o)
	var tr metadata.MD
	_, err := c.Put(context.Background(), &echov1.PutRequest{RequestId: "x"}, grpc.Trailer(&tr))
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, []string{"-1"}, tr.Get("grpc-retry-pushback-ms"))

	// The caller leaves after 100 ms; the origin works on for 300 ms.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = c.Get(ctx, &echov1.GetRequest{RequestId: "slow"})
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.Equal(t, 1, o.CountID(echov1.EchoService_Get_FullMethodName, "slow"), "the call reached the origin")
	require.Eventually(t, func() bool { return o.Wasted() == 1 }, 10*time.Second, time.Millisecond)
}

func TestChargeLedger(t *testing.T) {
	o := origin.New(nil)
	c := start(t, origin.Bufconn(), o)
	for range 2 {
		_, err := c.Charge(context.Background(), &echov1.ChargeRequest{RequestId: "p", Account: "acct", AmountCents: 250})
		require.NoError(t, err)
	}
	cents, n := o.Balance("acct")
	assert.Equal(t, int64(500), cents)
	assert.Equal(t, 2, n)
}

func TestStreams(t *testing.T) {
	o := origin.New(func(c origin.Call) origin.Reply {
		if c.RequestID == "broken" {
			return origin.Reply{Code: codes.Unavailable, FailAfter: 2}
		}
		return origin.Reply{}
	})
	c := start(t, origin.Bufconn(), o)
	ctx := context.Background()

	// List: all items, or two then the error.
	ls, err := c.List(ctx, &echov1.ListRequest{RequestId: "ok", Count: 5})
	require.NoError(t, err)
	n := 0
	for {
		_, err := ls.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		n++
	}
	assert.Equal(t, 5, n)
	ls, err = c.List(ctx, &echov1.ListRequest{RequestId: "broken", Count: 5})
	require.NoError(t, err)
	for i := range 2 {
		m, err := ls.Recv()
		require.NoError(t, err)
		assert.Equal(t, uint32(i), m.GetIndex())
	}
	_, err = ls.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err))

	// Upload: size and checksum.
	up, err := c.Upload(ctx)
	require.NoError(t, err)
	for range 3 {
		require.NoError(t, up.Send(&echov1.UploadRequest{RequestId: "u", Chunk: []byte("abc")}))
	}
	res, err := up.CloseAndRecv()
	require.NoError(t, err)
	assert.Equal(t, uint64(9), res.GetSize())
	assert.Equal(t, uint32(3), res.GetChunks())
	assert.Len(t, o.Uploads(), 1)

	// Chat: echoes.
	ch, err := c.Chat(ctx)
	require.NoError(t, err)
	for i := range uint32(3) {
		require.NoError(t, ch.Send(&echov1.ChatRequest{RequestId: "c", Seq: i}))
		m, err := ch.Recv()
		require.NoError(t, err)
		assert.Equal(t, i, m.GetSeq())
	}
	require.NoError(t, ch.CloseSend())
	_, err = ch.Recv()
	assert.Equal(t, io.EOF, err)
}

func TestHopForwards(t *testing.T) {
	o := origin.New(nil)
	inner := start(t, origin.Bufconn(), o)
	outer := start(t, origin.Bufconn(), &origin.Hop{Next: inner})
	_, err := outer.Get(context.Background(), &echov1.GetRequest{RequestId: "h"})
	require.NoError(t, err)
	assert.Equal(t, 1, o.CountID(echov1.EchoService_Get_FullMethodName, "h"))
}
