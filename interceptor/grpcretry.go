package interceptor

import (
	"strconv"
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
//     grpc-retry-pushback-ms or one grpc-go waits for, with attempts left
//     and the call's context alive), says they are off;
//   - otherwise, more than one attempt of grpc-go's within one attempt of
//     the suite says they are on.
//
// A transparent retry (grpc-go sends a stream again that the server
// refused, REFUSED_STREAM, or that a closing connection never sent: gRFC
// A6 has it retried whether retries are on or off) also asks the call
// credentials: so a failure that grpc-go would have retried says they are
// off after any number of its tries that leaves the policy attempts, and
// only more tries with no such failure say they are on.
//
// The latest evidence wins. Until there is any, the suite assumes they are
// on and sends one attempt per call: a fresh ClientConn's first retryable
// failure is the evidence, and the call that had it is retried by the
// suite at once. Either reading can be briefly wrong, and is corrected by
// the next call that says otherwise: grpc-go's retry throttling
// (retryThrottling) refuses a retry like retries that are off, and a
// transparent retry of a call that then succeeds looks like a retry.
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
// a method that has a retryPolicy, when the Client watches it (c.watched):
// calls is how many attempts grpc-go made (the call credentials' count),
// err the attempt's outcome, hdr its response header (nil: none came, the
// response was trailers only, or the stream ended before one) and tr its
// trailer. req is the request, nil for a stream.
func (c *call) noteGRPCRetries(a *attempt, calls int32, err error, hdr, tr metadata.MD, req any) {
	w := c.watched
	if w == nil {
		return
	}
	if !c.mc.grpcRetry && err != nil {
		// Sent before the ClientConn had its service config: read it now.
		c.mc = c.route.readMethodConfig(c.mc.cc, c.client.now(), c.mc.watch)
	}
	switch {
	case err != nil && c.grpcWouldRetry(a, calls, err, hdr, tr, req):
		w.off.Store(true)
	case calls > 1:
		w.off.Store(false)
	}
}

// grpcWouldRetry reports whether grpc-go, its retries on, would have
// retried the failure err that attempt a ended with, after calls tries of
// its own: a code of the retryPolicy, in a response without a header,
// with no pushback or one grpc-go waits for (one value, 0 or more), the
// call's context alive, a request within grpc-go's retry buffer, and
// attempts left. calls counts grpc-go's transparent retries too (a stream
// the server refused, or that a closing connection never sent: gRFC A6
// retries it whether retries are on or off), which do not count against
// the policy's attempts: a failure after one is evidence like a failure
// after a single try, as long as the tries leave attempts.
func (c *call) grpcWouldRetry(a *attempt, calls int32, err error, hdr, tr metadata.MD, req any) bool {
	mc := c.mc
	if calls < 1 || hdr != nil || a.ctx.Err() != nil || !mc.grpcRetry || int(calls) >= mc.grpcAttempts || !mc.grpcCodes.Has(status.Code(err)) {
		return false
	}
	switch ps := tr[semconv.PushbackKey]; len(ps) {
	case 0:
	case 1:
		if ms, perr := strconv.Atoi(ps[0]); perr != nil || ms < 0 {
			return false // grpc-go stops at it
		}
	default:
		return false
	}
	m, ok := req.(proto.Message)
	return !ok || proto.Size(m) <= retryBuffer
}
