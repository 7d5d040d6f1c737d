package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/deadline"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/outlier"
	"github.com/stormguard/stormguard/overload"
	"github.com/stormguard/stormguard/semconv"
)

// The incidents are the example's second part, on the wall clock, after
// the ticks: what the ticks do not show.
//
//   - ledger: three replicas behind one ClientConn with the outlier policy
//     (round_robin inside), one of them answering UNAVAILABLE to
//     everything. A Client of its own (wall clock; no fail-over and no
//     budget, so that every failure on the dead replica is retried after
//     a real backoff, and the policy sees every one) sends LedgerCalls
//     Puts: the retries' backoffs are grpc.client.call.retry_delay, and
//     the policy ejects the dead replica (gRFC A91's ejections_enforced).
//   - vault: one service behind a Server that refuses what it should
//     (stormguard.server.refusals by reason), called by a plain grpc-go
//     client: VaultDoomed Puts with 1 s left, under the server's 2 s
//     minimum (doomed); while one keyed Charge holds the store's only
//     entry and the only place in flight, VaultShed Puts (shed) and
//     VaultBusy keyed Charges (dedupe_busy); then VaultNotifies Notifies,
//     which fail, with grpc-go's own retryPolicy (3 attempts on
//     UNAVAILABLE), whose retries the method's server retry budget refuses
//     once the method fails (retry_budget).

// The incidents' sizes.
const (
	LedgerCalls   = 300
	VaultDoomed   = 5
	VaultShed     = 4
	VaultBusy     = 3
	VaultNotifies = 40
)

// ledgerBackoff bounds the ledger Client's backoffs (each retry waits a
// random time in [d/2, d], d at most this).
const ledgerBackoff = 20 * time.Millisecond

// vaultMinRemaining is the vault Server's minimum time left on arrival.
const vaultMinRemaining = 2 * time.Second

// vaultRetryConfig is the vault client's grpc-go retryPolicy: Notify only.
const vaultRetryConfig = `{"methodConfig": [{"name": [{"service": "echo.v1.EchoService", "method": "Notify"}],
  "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`

// incidents is the incidents' state.
type incidents struct {
	replicas      []*origin.Origin // the first is dead
	replicaAddrs  []string
	ledgerServers []*origin.Server
	ledgerConn    *grpc.ClientConn
	ledger        echov1.EchoServiceClient

	vaultRelease chan struct{} // closed: the held Charge returns
	vaultHeld    chan struct{} // the held Charge reached the handler
	vaultServer  *origin.Server
	vaultConn    *grpc.ClientConn
	vault        echov1.EchoServiceClient

	mu      sync.Mutex
	retried int           // ledger calls that retried (OnRetry with Attempt 2)
	backoff time.Duration // the ledger retries' backoffs, as OnRetry reported them
}

// IncidentReport is what the incidents did, as the callers saw it.
type IncidentReport struct {
	// LedgerCalls and LedgerOK count the ledger's calls and successes;
	// Retried the calls that retried, and Backoff the sum of their
	// retries' backoffs (Hooks.OnRetry), a lower bound of their retry
	// delay. DeadReplica is the dead replica's address, and DeadRequests
	// the requests it got.
	LedgerCalls, LedgerOK, Retried int
	Backoff                        time.Duration
	DeadReplica                    string
	DeadRequests                   int
	// Refused counts the vault's calls by the reason the Server refused
	// them for, as their statuses say; Handled counts the others, which
	// reached the handler (the Notifies fail there).
	Refused map[string]int
	Handled int
}

// startIncidents starts the replicas, the vault and their clients, with
// the metrics going to d.mp.
func (d *Demo) startIncidents() error {
	in := &incidents{vaultRelease: make(chan struct{}), vaultHeld: make(chan struct{}, 1)}
	d.inc = in

	// The ledger: three replicas, the first dead, each behind the suite's
	// server, and a ClientConn with the outlier policy over a manual
	// resolver listing them.
	var eps []resolver.Endpoint
	for i := range 3 {
		script := origin.Succeed()
		if i == 0 {
			script = origin.Always(codes.Unavailable)
		}
		o := origin.New(script)
		l, err := origin.TCP()
		if err != nil {
			return err
		}
		srv := interceptor.NewServer()
		in.ledgerServers = append(in.ledgerServers, origin.Serve(l, o, grpc.ChainUnaryInterceptor(srv.Unary())))
		in.replicas, in.replicaAddrs = append(in.replicas, o), append(in.replicaAddrs, l.Target)
		eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: l.Target}}})
	}
	// The policy records on the MeterProvider set before its balancer is
	// built (when the ClientConn first resolves).
	outlier.SetMeterProvider(d.mp)
	r := manual.NewBuilderWithScheme("ledger")
	r.InitialState(resolver.State{Endpoints: eps})
	guard := interceptor.NewClient(
		interceptor.WithTelemetry(interceptor.Telemetry{MeterProvider: d.mp}),
		interceptor.WithBudget(nil),
		interceptor.WithoutFailover(),
		interceptor.WithRetryPolicy(interceptor.RetryPolicy{BackoffBase: ledgerBackoff, BackoffMax: ledgerBackoff}),
		interceptor.WithHooks(interceptor.Hooks{OnRetry: func(e interceptor.RetryEvent) {
			in.mu.Lock()
			defer in.mu.Unlock()
			if e.Attempt == 2 {
				in.retried++
			}
			in.backoff += e.Delay
		}}),
	)
	var err error
	in.ledgerConn, err = grpc.NewClient("ledger:///replicas", append(guard.DialOptions(),
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(r), outlier.DialOption(outlier.Config{}))...)
	if err != nil {
		return err
	}
	in.ledger = echov1.NewEchoServiceClient(in.ledgerConn)

	// The vault: its Server refuses doomed work, sheds beyond one call in
	// flight, has room for one keyed write, and a retry budget per method.
	vault := origin.New(func(c origin.Call) origin.Reply {
		switch {
		case c.RequestID == "held":
			in.vaultHeld <- struct{}{}
			<-in.vaultRelease
		case c.Method == echov1.EchoService_Notify_FullMethodName:
			return origin.Reply{Code: codes.Unavailable, Message: "vault: notifications are down"}
		}
		return origin.Reply{}
	})
	l, err := origin.TCP()
	if err != nil {
		return err
	}
	srv := interceptor.NewServer(
		interceptor.WithServerTelemetry(interceptor.Telemetry{MeterProvider: d.mp}),
		interceptor.WithServerDeadline(deadline.ServerConfig{MinRemaining: vaultMinRemaining}),
		interceptor.WithOverload(overload.New(overload.Config{NoAdmission: true, NoAdaptive: true, MaxConcurrency: 1})),
		interceptor.WithDedupe(dedupe.NewServer(dedupe.Config{AllowAnonymous: true, Store: dedupe.NewMemoryStore(dedupe.MemoryConfig{MaxEntries: 1})})),
	)
	in.vaultServer = origin.Serve(l, vault, grpc.ChainUnaryInterceptor(srv.Unary()))
	// A plain grpc-go client, with grpc-go's own retries for Notify.
	in.vaultConn, err = grpc.NewClient(l.Target, l.ConnectOptions(grpc.WithDefaultServiceConfig(vaultRetryConfig))...)
	if err != nil {
		return err
	}
	in.vault = echov1.NewEchoServiceClient(in.vaultConn)
	return nil
}

func (in *incidents) close() {
	select {
	case <-in.vaultRelease:
	default:
		close(in.vaultRelease)
	}
	for _, c := range []*grpc.ClientConn{in.ledgerConn, in.vaultConn} {
		if c != nil {
			_ = c.Close()
		}
	}
	for _, s := range append(in.ledgerServers, in.vaultServer) {
		if s != nil {
			s.Stop()
		}
	}
}

// RunIncidents runs the incidents, on the wall clock, and reports what
// their callers saw.
func (d *Demo) RunIncidents(ctx context.Context) (IncidentReport, error) {
	in := d.inc
	rep := IncidentReport{LedgerCalls: LedgerCalls, DeadReplica: in.replicaAddrs[0], Refused: map[string]int{}}
	for i := range LedgerCalls {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		_, err := in.ledger.Put(cctx, &echov1.PutRequest{RequestId: "ledger-" + strconv.Itoa(i), Key: "k"})
		cancel()
		if err == nil {
			rep.LedgerOK++
		}
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
	}
	in.mu.Lock()
	rep.Retried, rep.Backoff = in.retried, in.backoff
	in.mu.Unlock()
	rep.DeadRequests = in.replicas[0].Total()
	return rep, in.runVault(ctx, &rep)
}

// runVault makes the vault's calls and counts their outcomes in rep.
func (in *incidents) runVault(ctx context.Context, rep *IncidentReport) error {
	count := func(err error) {
		if r := vaultReason(err); r != "" {
			rep.Refused[r]++
		} else {
			rep.Handled++
		}
	}
	for range VaultDoomed {
		cctx, cancel := context.WithTimeout(ctx, vaultMinRemaining/2)
		_, err := in.vault.Put(cctx, &echov1.PutRequest{RequestId: "doomed"})
		cancel()
		count(err)
	}
	keyed := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, idempotency.MetadataKey, key)
	}
	held := make(chan error, 1)
	go func() {
		_, err := in.vault.Charge(keyed("held"), &echov1.ChargeRequest{RequestId: "held", Account: "a", AmountCents: 1})
		held <- err
	}()
	select {
	case <-in.vaultHeld:
	case <-ctx.Done():
		return ctx.Err()
	}
	for range VaultShed {
		_, err := in.vault.Put(ctx, &echov1.PutRequest{RequestId: "shed"})
		count(err)
	}
	for i := range VaultBusy {
		_, err := in.vault.Charge(keyed("busy-"+strconv.Itoa(i)), &echov1.ChargeRequest{RequestId: "busy", Account: "a", AmountCents: 1})
		count(err)
	}
	close(in.vaultRelease)
	count(<-held)
	for range VaultNotifies {
		_, err := in.vault.Notify(ctx, &echov1.NotifyRequest{RequestId: "notify"})
		count(err)
	}
	return ctx.Err()
}

// vaultReason is the reason a vault call was refused for, read from its
// status; "" when it reached the handler.
func vaultReason(err error) string {
	st := status.Convert(err)
	for _, det := range st.Details() {
		if info, ok := det.(*errdetails.ErrorInfo); ok && info.GetDomain() == semconv.ErrorDomain {
			switch info.GetReason() {
			case semconv.ErrorReasonOverloaded:
				return semconv.ServerReasonShed
			case semconv.ErrorReasonRetryBudget:
				return semconv.ServerReasonRetryBudget
			case semconv.ErrorReasonDeadlineTooShort:
				return semconv.ServerReasonDoomed
			}
		}
	}
	switch st.Code() {
	case codes.DeadlineExceeded: // the server's minimum: its message says so
		return semconv.ServerReasonDoomed
	case codes.ResourceExhausted: // the dedupe store's refusal
		return semconv.ServerReasonDedupeBusy
	}
	return ""
}

// PrintIncidents prints what the incidents did.
func PrintIncidents(out io.Writer, r IncidentReport) {
	fmt.Fprintf(out, "incidents: ledger (3 replicas, outlier policy, %s dead): %d calls, %d ok, %d retried after %v of backoff; the dead replica got %d requests\n",
		r.DeadReplica, r.LedgerCalls, r.LedgerOK, r.Retried, r.Backoff.Round(time.Millisecond), r.DeadRequests)
	fmt.Fprintf(out, "incidents: vault refused doomed %d, shed %d, dedupe_busy %d, retry_budget %d; %d reached the handler\n",
		r.Refused[semconv.ServerReasonDoomed], r.Refused[semconv.ServerReasonShed], r.Refused[semconv.ServerReasonDedupeBusy],
		r.Refused[semconv.ServerReasonRetryBudget], r.Handled)
}
