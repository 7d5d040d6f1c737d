package compare

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// connect waits until cc is ready, without sending a call (a successful
// warm-up call would fund stormguard's budget and grpc-go's throttle).
func connect(tb testing.TB, cc *grpc.ClientConn) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			tb.Fatalf("not ready: %v", s)
		}
	}
}

// TestContendersAreEquivalent checks that the contenders configured to
// retry alike do: 3 attempts on UNAVAILABLE, 1 on another code, and 2 when
// only the first attempt fails, ending with the same status code.
func TestContendersAreEquivalent(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []contender{grpcGo(), stormguardLean(), middleware(), failsafeGo()} {
		t.Run(c.name, func(t *testing.T) {
			o := origin.New(nil)
			l := origin.Bufconn()
			srv := origin.Serve(l, o)
			defer srv.Stop()
			client := echov1.NewEchoServiceClient(c.mustDial(t, l))
			for _, tt := range []struct {
				script   origin.Script
				calls    int
				want     codes.Code
				attempts int
			}{
				{origin.Always(codes.Unavailable), 1, codes.Unavailable, attempts},
				{origin.Always(codes.Internal), 1, codes.Internal, 1},
				{origin.FailFirst(1, codes.Unavailable), 10, codes.OK, 20},
				{origin.FailFirst(attempts, codes.Unavailable), 1, codes.Unavailable, attempts},
			} {
				o.Reset()
				o.SetScript(tt.script)
				for i := range tt.calls {
					_, err := client.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)})
					if got := status.Code(err); got != tt.want {
						t.Errorf("call %d: code %v (%v), want %v", i, got, err, tt.want)
					}
				}
				if got := o.Total(); got != tt.attempts {
					t.Errorf("origin saw %d attempts for %d calls, want %d", got, tt.calls, tt.attempts)
				}
			}
		})
	}
}

// TestDeadOriginAmplification sends 50 concurrent calls to an origin that
// answers every attempt with UNAVAILABLE and counts the requests the
// origin saw, for each contender, over several rounds (each with a new
// client and origin). It logs the table; it asserts only what cannot
// depend on timing.
func TestDeadOriginAmplification(t *testing.T) {
	const calls, rounds = 50, 5
	contenders := []contender{
		grpcGo(), grpcGoThrottled(),
		stormguard(), stormguardLean(),
		middleware(),
		failsafeGo(), failsafeGoBudget(),
	}
	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "contender\tcalls\tcalls that reached the origin\torigin requests (min–max of %d rounds)\trequests/call\tcalls failed\tcodes returned\n", rounds)
	for _, c := range contenders {
		lo, hi := int(^uint(0)>>1), 0
		reachedLo, reachedHi := lo, 0
		failed := 0
		returned := map[codes.Code]int{}
		for range rounds {
			n, reached, f := deadOrigin(t, c, calls, returned)
			lo, hi = min(lo, n), max(hi, n)
			reachedLo, reachedHi = min(reachedLo, reached), max(reachedHi, reached)
			failed += f
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.2f–%.2f\t%d/%d\t%s\n", c.name, calls, span(reachedLo, reachedHi), span(lo, hi),
			float64(lo)/calls, float64(hi)/calls, failed, calls*rounds, codeCounts(returned))
		switch c.name {
		case stormguard().name:
			// At most 50 first attempts (fewer when the breaker opens
			// before every call was sent: timing), plus the retries the
			// budget grants: 10% of 50 deposits. The floor is a minimum,
			// not an addition: a retry it funds before the ratio has
			// credit counts against the ratio's credit.
			if limit := calls + calls/10; hi > limit {
				t.Errorf("%s: origin saw up to %d requests, want ≤ %d", c.name, hi, limit)
			}
		case grpcGo().name, stormguardLean().name, middleware().name, failsafeGo().name:
			if lo != calls*attempts || hi != calls*attempts {
				t.Errorf("%s: origin saw %d–%d requests, want %d", c.name, lo, hi, calls*attempts)
			}
		}
		if c.name != failsafeGoBudget().name && returned[codes.Unavailable] != calls*rounds {
			// failsafe-go's budget fails a refused retry with its own
			// budget.ErrExceeded, which gRPC callers see as Unknown.
			t.Errorf("%s: calls returned %s, want all Unavailable", c.name, codeCounts(returned))
		}
	}
	tw.Flush()
	t.Logf("dead origin, %d concurrent calls, max %d attempts:\n%s", calls, attempts, table.String())
}

// span formats a min–max range, or one number when they are equal.
func span(lo, hi int) string {
	if lo == hi {
		return fmt.Sprint(lo)
	}
	return fmt.Sprintf("%d–%d", lo, hi)
}

// codeCounts formats how many calls returned each code, e.g.
// "Unavailable×50".
func codeCounts(m map[codes.Code]int) string {
	var parts []string
	for code := codes.OK; code <= codes.Unauthenticated; code++ {
		if n := m[code]; n > 0 {
			parts = append(parts, fmt.Sprintf("%v×%d", code, n))
		}
	}
	return strings.Join(parts, " ")
}

// deadOrigin makes calls concurrent calls through c to an origin that is
// always UNAVAILABLE and returns how many requests the origin saw, how many
// calls sent it at least one, and how many calls failed; it counts the
// codes the calls returned in returned.
func deadOrigin(t *testing.T, c contender, calls int, returned map[codes.Code]int) (requests, reached, failed int) {
	t.Helper()
	o := origin.New(origin.Always(codes.Unavailable))
	l := origin.Bufconn()
	srv := origin.Serve(l, o)
	defer srv.Stop()
	cc, err := c.dial(l)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	connect(t, cc)
	client := echov1.NewEchoServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := make(chan struct{})
	errs := make(chan error, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			<-start
			_, err := client.Put(ctx, &echov1.PutRequest{RequestId: fmt.Sprint(i)})
			errs <- err
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			failed++
		}
		returned[status.Code(err)]++
	}
	ids := map[string]bool{}
	for _, call := range o.Calls() {
		ids[call.RequestID] = true
	}
	return o.Total(), len(ids), failed
}
