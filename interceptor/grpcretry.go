package interceptor

import (
	"sync/atomic"
	"weak"

	"github.com/stormguard/stormguard/semconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A method with a service config retryPolicy is retried by grpc-go itself,
// unless grpc-go's retries are off on its ClientConn (grpc.WithDisableRetry):
// the suite must then retry it (as it does for any other method), and must
// not when they are on (each of its attempts would be retried by grpc-go:
// the two would multiply). DialOptions turns them off, so its interceptors
// know. Interceptors installed by hand (Unary, Stream) cannot ask the
// ClientConn, so they watch what grpc-go does with the calls of such
// methods (grpcRetries).

// grpcRetries is what a Client has seen of grpc-go's retries on one
// ClientConn, from the calls of methods that have a retryPolicy. The
// suite's call credentials of an attempt are asked for metadata once per
// attempt grpc-go makes (a retry of its own, or a transparent retry of a
// stream that never reached the server). So:
//
//   - a failure that grpc-go would have retried, had its retries been on
//     (a code of the retryPolicy, in a response that carried no header, no
//     grpc-retry-pushback-ms, with attempts left and the call's context
//     alive), after exactly one attempt of grpc-go's, says they are off;
//   - more than one attempt of grpc-go's within one attempt of the suite
//     says they are on.
//
// The latest evidence wins. Until there is any, the suite assumes they are
// on and sends one attempt per call: a fresh ClientConn's first retryable
// failure is the evidence, and the call that had it is retried by the
// suite at once. Either reading can be briefly wrong, and is corrected by
// the next call that says otherwise: grpc-go's retry throttling
// (retryThrottling) refuses a retry like retries that are off, and a
// transparent retry looks like a retry.
type grpcRetries struct {
	off atomic.Bool
}

// grpcRetriesOf returns what the Client has seen of grpc-go's retries on
// cc (nil: cc is nil, or the Client already watches maxRoutes
// ClientConns). ClientConns are held weakly: a closed one is not kept
// alive.
func (c *Client) grpcRetriesOf(cc *grpc.ClientConn) *grpcRetries {
	if cc == nil {
		return nil
	}
	r, _ := c.grpcRetry.LoadOrCreateIfRoom(weak.Make(cc), func(weak.Pointer[grpc.ClientConn]) *grpcRetries { return new(grpcRetries) })
	return r
}

// retryBuffer is grpc-go's default retry buffer (grpc.MaxRetryRPCBufferSize):
// a request larger than this commits the call, which grpc-go then does not
// retry, retries on or off.
const retryBuffer = 256 << 10

// noteGRPCRetries reads what grpc-go did with attempt a of the suite, of
// a method that has a retryPolicy, when the Client watches it (c.watch):
// calls is how many attempts grpc-go made (the call credentials' count),
// err the attempt's outcome, hdr its response header (nil: none came, the
// response was trailers only, or the stream ended before one) and tr its
// trailer. req is the request, nil for a stream.
func (c *call) noteGRPCRetries(a *attempt, calls int32, err error, hdr, tr metadata.MD, req any) {
	w := c.grpc.watched
	if w == nil {
		return
	}
	if !c.grpc.mc.grpcRetry && err != nil {
		// Sent before the ClientConn had its service config: read it now.
		c.grpc.mc = c.route.readMethodConfig(c.cc, c.client.now(), c.watch)
	}
	switch {
	case calls > 1:
		w.off.Store(false)
	case calls == 1 && err != nil && hdr == nil && a.ctx.Err() == nil && c.grpc.mc.grpcRetry &&
		len(tr[semconv.PushbackKey]) == 0 && c.grpc.mc.grpcAttempts > 1 && c.grpc.mc.grpcCodes.Has(status.Code(err)):
		if m, ok := req.(proto.Message); ok && proto.Size(m) > retryBuffer {
			return
		}
		w.off.Store(true)
	}
}
