package interceptor

import (
	"context"

	"github.com/stormguard/stormguard/idempotency/dedupe"
)

// WithTrustedBudgets lets the named callers' own retry budgets stand for
// the server's (see WithServerBudget): a retry or hedge from one of them
// that says its client's budget paid for it (semconv.BudgetedKey, which
// the suite's clients send only when an enforcing budget did) is served
// even when the server's budget cannot pay for it, so that the two budgets
// do not both charge it. It is still withdrawn from the server's budget
// when that can pay, so that other callers' retries get only what is
// left.
//
// identity returns who is calling, from the call's context; nil means
// dedupe.DefaultIdentity, the identity the dedupe store scopes keys by: a
// hash of the TLS client certificate the caller presented, of its
// authorization metadata, or of both (the identity of a credential is
// what dedupe.DefaultIdentity returns for a context that carries it). Set
// it to the principal your authentication interceptor put in the context,
// if you have one. callers are the identities trusted, as identity returns
// them; "" (a caller without identity) is never trusted.
//
// The identity must be one a client cannot forge: a certificate the TLS
// handshake verified, a credential only the trusted clients hold, or a
// principal the server authenticated. Only a marked retry the server's
// budget would refuse asks for it, so it costs nothing on other calls.
//
// Off by default: every retry and hedge is charged to the server's
// budget, whoever sends it and whatever its headers say. A later
// WithTrustedBudgets replaces an earlier one; no callers turns it off.
func WithTrustedBudgets(identity func(ctx context.Context) string, callers ...string) ServerOption {
	var t *budgetTrust
	if len(callers) > 0 {
		t = &budgetTrust{identity: identity, callers: make(map[string]struct{}, len(callers))}
		if t.identity == nil {
			t.identity = dedupe.DefaultIdentity
		}
		for _, c := range callers {
			if c != "" {
				t.callers[c] = struct{}{}
			}
		}
	}
	return serverOptionFunc(func(o *serverOptions) { o.trust = t })
}

// budgetTrust is WithTrustedBudgets' set of callers.
type budgetTrust struct {
	identity func(ctx context.Context) string
	callers  map[string]struct{}
}

// paidByTrusted reports whether a retry arriving with ctx says its
// client's budget paid for it, and comes from a caller the Server trusts
// to say so.
func (s *Server) paidByTrusted(ctx context.Context) bool {
	t := s.o.trust
	if t == nil || !isBudgeted(ctx) {
		return false
	}
	id := t.identity(ctx)
	_, ok := t.callers[id]
	return ok && id != ""
}
