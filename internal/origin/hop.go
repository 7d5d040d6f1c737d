package origin

import (
	"context"
	"errors"
	"io"

	"google.golang.org/grpc"

	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// Hop is an EchoService that forwards every call to Next with the handler's
// context, so a deadline and cancellation travel down a chain of services.
// Set its fields before it serves; it is then safe for concurrent use.
type Hop struct {
	echov1.UnimplementedEchoServiceServer
	Next echov1.EchoServiceClient
	// Fresh, when set, derives the context of the outgoing call from the
	// handler's context, e.g. a proxy that drops the deadline and starts a
	// fresh one (it may copy incoming metadata to the outgoing context).
	Fresh func(ctx context.Context) (context.Context, context.CancelFunc)
}

// Register registers h as the EchoService of s.
func (h *Hop) Register(s grpc.ServiceRegistrar) { echov1.RegisterEchoServiceServer(s, h) }

func (h *Hop) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if h.Fresh == nil {
		return ctx, func() {}
	}
	return h.Fresh(ctx)
}

// Get forwards the call to Next.
func (h *Hop) Get(ctx context.Context, r *echov1.GetRequest) (*echov1.GetResponse, error) {
	ctx, cancel := h.ctx(ctx)
	defer cancel()
	return h.Next.Get(ctx, r)
}

// Put forwards the call to Next.
func (h *Hop) Put(ctx context.Context, r *echov1.PutRequest) (*echov1.PutResponse, error) {
	ctx, cancel := h.ctx(ctx)
	defer cancel()
	return h.Next.Put(ctx, r)
}

// Charge forwards the call to Next.
func (h *Hop) Charge(ctx context.Context, r *echov1.ChargeRequest) (*echov1.ChargeResponse, error) {
	ctx, cancel := h.ctx(ctx)
	defer cancel()
	return h.Next.Charge(ctx, r)
}

// Notify forwards the call to Next.
func (h *Hop) Notify(ctx context.Context, r *echov1.NotifyRequest) (*echov1.NotifyResponse, error) {
	ctx, cancel := h.ctx(ctx)
	defer cancel()
	return h.Next.Notify(ctx, r)
}

// List forwards the stream to Next, message by message.
func (h *Hop) List(r *echov1.ListRequest, s grpc.ServerStreamingServer[echov1.ListResponse]) error {
	ctx, cancel := h.ctx(s.Context())
	defer cancel()
	in, err := h.Next.List(ctx, r)
	if err != nil {
		return err
	}
	for {
		m, err := in.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		if err := s.Send(m); err != nil {
			return err
		}
	}
}
