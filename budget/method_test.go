package budget_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// methodAt drives a Method on explicit times: at is the offset from base.
type methodAt struct {
	*budget.Method
	at time.Duration
}

func (m *methodAt) now() time.Time { return base.Add(m.at) }

// calls sends n first attempts, each ending as failed says.
func (m *methodAt) calls(n int, failed bool) {
	for range n {
		m.AdmitAt(m.now(), false, 0)
		m.DoneAt(m.now(), failed)
	}
}

// retries asks n retries and returns how many were admitted.
func (m *methodAt) retries(n int) int {
	got := 0
	for range n {
		if m.AdmitAt(m.now(), true, 0) {
			got++
		}
	}
	return got
}

// While the method serves, its retries are admitted without limit and
// cost nothing: they are fail-overs from peers that failed.
func TestMethodAdmitsRetriesWhileTheMethodServes(t *testing.T) {
	b := budget.New(budget.Config{})
	m := &methodAt{Method: budget.NewMethod(b)}
	m.calls(100, false)
	if got := m.retries(1000); got != 1000 {
		t.Fatalf("admitted %d of 1000 retries of a method that serves", got)
	}
	if st := b.StatsAt(m.now()); st.Granted != 0 || st.Refused != 0 || st.Requests != 100 {
		t.Fatalf("the budget was asked for them: %+v", st)
	}
	if m.FailingAt(m.now()) {
		t.Fatal("a method that served all its calls fails")
	}
}

// While the method fails more than the ratio of its calls, its retries are
// paid from the budget: 100 first attempts pay for 10, plus the two it
// banks at most (it banked them before) and what it lends (10% of the last
// second's first attempts, more than the burst of 5).
func TestMethodChargesRetriesWhileTheMethodFails(t *testing.T) {
	m := &methodAt{Method: budget.NewMethod(budget.New(budget.Config{}))}
	m.calls(100, true)
	if !m.FailingAt(m.now()) {
		t.Fatal("a method that failed every call does not fail")
	}
	if got, want := m.retries(100), 2+10; got != want {
		t.Fatalf("admitted %d retries, want %d", got, want)
	}
}

// The failure share is judged over the last MethodWindow, with at least
// MethodMinCalls outcomes, and against the ratio: a tenth fails is not
// failing; more is.
func TestMethodJudgesItsRecentFailureShare(t *testing.T) {
	m := &methodAt{Method: budget.NewMethod(budget.New(budget.Config{}))}
	m.calls(budget.MethodMinCalls-1, true)
	if m.FailingAt(m.now()) {
		t.Fatalf("failing on %d outcomes", budget.MethodMinCalls-1)
	}
	m.calls(1, true)
	if !m.FailingAt(m.now()) {
		t.Fatalf("not failing on %d failures", budget.MethodMinCalls)
	}
	m.at = budget.MethodWindow
	if m.FailingAt(m.now()) {
		t.Fatal("failures older than the window still count")
	}
	m.calls(90, false)
	m.calls(10, true)
	if m.FailingAt(m.now()) {
		t.Fatal("failing at exactly the ratio")
	}
	m.calls(1, true)
	if !m.FailingAt(m.now()) {
		t.Fatal("not failing above the ratio")
	}
}

// The zero Method uses a Budget of the default Config; a nil one admits
// everything; NewMethod(nil) imposes no budget.
func TestMethodZeroAndNil(t *testing.T) {
	var zero budget.Method
	m := &methodAt{Method: &zero}
	m.calls(20, true)
	if got := m.retries(100); got != 2+5 {
		t.Fatalf("zero Method admitted %d retries, want 7 (2 of credit, a loan of 5)", got)
	}
	var null *budget.Method
	if !null.AdmitAt(base, true, 0) || null.FailingAt(base) {
		t.Fatal("a nil Method refuses or fails")
	}
	null.DoneAt(base, true)
	m = &methodAt{Method: budget.NewMethod(nil)}
	m.calls(20, true)
	if got := m.retries(100); got != 100 {
		t.Fatalf("NewMethod(nil) admitted %d of 100 retries", got)
	}
}

// Concurrent callers: what is admitted never exceeds what the budget
// grants (run under -race).
func TestMethodConcurrentUse(t *testing.T) {
	b := budget.New(budget.Config{Burst: -1})
	m := budget.NewMethod(b)
	for range 100 {
		m.AdmitAt(base, false, 0)
		m.DoneAt(base, true)
	}
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if m.AdmitAt(base, true, 0) {
					admitted.Add(1)
				}
				m.DoneAt(base, true)
			}
		})
	}
	wg.Wait()
	if st := b.StatsAt(base); admitted.Load() != int64(st.Granted) || st.Granted > 2+10 {
		t.Fatalf("admitted %d, granted %+v", admitted.Load(), st)
	}
}

// A fleet's first failures: 100 clients, each its own Budget, would lend
// themselves 5 retries each at the start of a failure; the Method lends
// as much (Burst per client that sent it a first attempt in the last
// second, at most one retry per first attempt of the last second), so
// that those retries are not refused here. One client sending as many
// first attempts is lent what its own Budget would lend it: 10% of the
// last second's.
func TestMethodLendsAsTheFleetsBudgetsWould(t *testing.T) {
	for _, tc := range []struct {
		clients, perClient, want int
	}{
		{100, 5, 2 + 500},
		{1, 500, 2 + 50},
		{10, 50, 2 + 50},    // Burst × 10 = 50: as 10% of the last second's
		{1000, 1, 2 + 1000}, // Burst × 1000, at most one per first attempt
	} {
		m := &methodAt{Method: budget.NewMethod(budget.New(budget.Config{}))}
		for i := range tc.perClient {
			for c := range tc.clients {
				m.at = time.Duration(i*tc.clients+c) * time.Millisecond / time.Duration(tc.clients*tc.perClient)
				m.AdmitAt(m.now(), false, uint64(c)+1)
				m.DoneAt(m.now(), true)
			}
		}
		got := 0
		for range 2 * tc.clients * tc.perClient {
			if m.AdmitAt(m.now(), true, 1) {
				got++
			}
		}
		// The sketch counts clients to within a few percent.
		if lo, hi := tc.want-tc.want/20, tc.want+tc.want/20; got < lo || got > hi {
			t.Errorf("%d clients × %d first attempts: %d retries admitted, want about %d", tc.clients, tc.perClient, got, tc.want)
		}
	}
}

// A method's server asks PromiseAt when it answers a failure: while the
// method serves, a retry is admitted for nothing, and nothing is taken.
// While it fails, the retry is withdrawn when promised, and the next
// retry takes the promise even when the budget has nothing left: the
// retries it promised are the ones it admits, and a false answer stands
// for the retry it would refuse.
func TestMethodPromisesTheRetriesItWouldAdmit(t *testing.T) {
	b := budget.New(budget.Config{Burst: -1})
	m := &methodAt{Method: budget.NewMethod(b)}
	m.calls(100, false)
	if !m.PromiseAt(m.now(), false) {
		t.Fatal("a method that serves refused to promise a retry")
	}
	if st := b.StatsAt(m.now()); st.Granted != 0 || st.Refused != 0 {
		t.Fatalf("a promise while the method serves took something: %+v", st)
	}
	m.at += 5 * time.Second
	m.calls(20, true) // 20 first attempts: 2 retries of credit (the most banked), and 2 of loan (10% of them)
	if !m.FailingAt(m.now()) {
		t.Fatal("a method that failed every call lately does not fail")
	}
	promised := 0
	for range 20 {
		if m.PromiseAt(m.now(), false) {
			promised++
		}
	}
	if promised != budget.MaxCredit+2 {
		t.Fatalf("promised %d retries on %d of credit and 2 of loan", promised, budget.MaxCredit)
	}
	if got := m.retries(promised); got != promised {
		t.Fatalf("admitted %d of the %d promised retries", got, promised)
	}
	if m.retries(1) != 0 {
		t.Fatal("a retry beyond the promises was admitted from a spent budget")
	}
	if st := b.StatsAt(m.now()); st.Granted != uint64(promised) || st.Refused != uint64(20-promised+1) {
		t.Fatalf("%+v: want the promises granted once, the rest refused", st)
	}
}

// A promise not taken (its caller did not retry: its own budget refused,
// it left) lapses by the end of the second after the one it was made in,
// and the credit withdrawn for it is given back.
func TestMethodPromiseLapses(t *testing.T) {
	b := budget.New(budget.Config{Burst: -1})
	m := &methodAt{Method: budget.NewMethod(b)}
	m.calls(20, true) // 2 retries of credit, 2 of loan
	promised := 0
	for m.PromiseAt(m.now(), false) {
		promised++
	}
	if st := b.StatsAt(m.now()); promised != 4 || st.Credit != -2 || st.Lending {
		t.Fatalf("%d promises, %+v; want 4, the loan (2) spent, lending stopped", promised, st)
	}
	m.at += 2 * time.Second
	m.calls(10, true) // keeps the method failing; repays 1 of the loan
	if m.retries(1) != 1 {
		t.Fatal("a retry two seconds on was refused: the lapsed promises' credit was not given back")
	}
	if st := b.StatsAt(m.now()); st.Credit != budget.MaxCredit-1 {
		t.Fatalf("credit %v after the lapse and one retry, want %d", st.Credit, budget.MaxCredit-1)
	}
}
