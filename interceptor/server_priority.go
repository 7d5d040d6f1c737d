package interceptor

import (
	"context"

	"google.golang.org/grpc/metadata"

	"github.com/stormguard/stormguard/priority"
	"github.com/stormguard/stormguard/semconv"
)

// WithPriorityCap bounds the priority the server honours (see package
// priority). For each call, limit returns the highest priority honoured
// from its caller, given the call's incoming context (its peer, its
// credentials' AuthInfo, its metadata); a call that claims more, or that
// claims nothing and is Default, is served at that priority: its place in
// the overload protection's shedding order, and the priority its handler's
// outgoing calls inherit. For example, to honour Critical only from
// trusted peers:
//
//	interceptor.WithPriorityCap(func(ctx context.Context) priority.Priority {
//		if trusted(ctx) {
//			return priority.Critical
//		}
//		return priority.Default
//	})
//
// The default (and nil) honours every claim: a caller may claim Critical.
// What that buys a caller who lies is bounded: docs/overload.md says how.
func WithPriorityCap(limit func(ctx context.Context) priority.Priority) ServerOption {
	return serverOptionFunc(func(o *serverOptions) { o.priorityCap = limit })
}

// withPriority reads the priority a call claims (semconv.PriorityKey: no
// value, or anything but one value that priority.Parse accepts, is
// Default), lowers it to WithPriorityCap's limit, and returns ctx carrying
// the priority honoured, unless it is Default: the handler's outgoing
// calls inherit it. A call without the header and without a cap costs a
// metadata lookup and allocates nothing.
func (s *Server) withPriority(ctx context.Context) context.Context {
	p := priority.Default
	if vs := metadata.ValueFromIncomingContext(ctx, semconv.PriorityKey); len(vs) == 1 {
		p, _ = priority.Parse(vs[0])
	}
	if s.o.priorityCap != nil {
		p = min(p, s.o.priorityCap(ctx))
	}
	if p == priority.Default {
		return ctx
	}
	return priority.NewContext(ctx, p)
}
