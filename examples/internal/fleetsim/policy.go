package fleetsim

import (
	"math/rand/v2"
	"time"

	"github.com/stormguard/stormguard/internal/engine"
	"github.com/stormguard/stormguard/overload"
)

// Code is an attempt's status, as far as the model needs it.
type Code uint8

// The codes an attempt ends with.
const (
	OK Code = iota
	Unavailable
	ResourceExhausted
	DeadlineExceeded
)

var codeNames = [...]string{"OK", "Unavailable", "ResourceExhausted", "DeadlineExceeded"}

// String returns the gRPC name of the code.
func (c Code) String() string { return codeNames[c] }

// NoPushback marks an Outcome without grpc-retry-pushback-ms; DoNotRetry
// is the pushback that says not to retry (any negative value does).
const (
	NoPushback time.Duration = -1 << 63
	DoNotRetry time.Duration = -time.Millisecond
)

// Outcome is what came back for an attempt.
type Outcome struct {
	Code Code
	// Pushback is the server's grpc-retry-pushback-ms: NoPushback, a
	// delay (≥ 0), or negative for "do not retry".
	Pushback time.Duration
	// Backend is the backend the attempt went to.
	Backend int
	// Dry is the suite's server's stormguard-budget-dry: its retry budget
	// could not pay for a retry of the attempt.
	Dry bool
}

// Verdict is a client's decision on a failed attempt: retry after Delay,
// or not.
type Verdict struct {
	Retry bool
	Delay time.Duration
}

// Call is one logical call in flight: what the kernel and the policies
// know of it. Policies keep their per-call state in the fields marked for
// them.
type Call struct {
	Client   int // the client's index in the fleet
	K        int // the call's number among its client's calls
	Due      time.Duration
	Deadline time.Time
	Attempts int // attempts sent so far (the first included)

	// Per-call state of the policies.
	eng      engine.Call    // the suite: the call in its engine
	att      engine.Attempt // the suite: the latest attempt in its engine
	tokens   int            // AWS: the retry quota tokens the in-flight retry holds
	active   bool           // Envoy: a retry of this call counts as active
	backoffN int            // retries since the last pushback (backoff growth)
	lastWait time.Duration  // Finagle: the last decorrelated backoff
	budgeted bool           // the suite: its retries say their budget paid

	// The kernel's.
	idx      int32
	gen      uint32
	due      int64 // ns since the run's start
	dl       int64
	backend  int
	sent     int64 // when the in-flight attempt was sent
	handled  int   // attempts that reached the handler
	state    uint8
	inflight bool            // an attempt is out (at the server, or on its way back)
	dlEv     bool            // its deadline event is scheduled
	last     Code            // the last attempt's code, while a retry waits
	pushback time.Duration   // the reply's pushback, while the reply travels
	ov       overload.Ticket // the suite's server: the attempt's ticket
	svr      bool            // the suite's server admitted the attempt
	held     bool            // the attempt waits in its server's queue (Held)
	asRetry  bool            // the suite's server took the attempt for a retry
	dry      bool            // the last reply's Outcome.Dry
	slow     bool
}

// Client is one client's retry policy and its state: a channel's, a
// process's. The kernel calls it in this order for a call: Begin; for
// each attempt Pick, then Settle with its outcome; when Settle asks for a
// retry, Send when the retry is due (after Verdict.Delay); End once.
type Client interface {
	// Begin is asked before a call's first attempt, at now: false refuses
	// the call locally (it fails, UNAVAILABLE, nothing sent).
	Begin(c *Call, now time.Time) bool
	// Pick returns the backend (0 to m−1) the next attempt goes to, and
	// whether it is sent there: false refuses it at its pick (nothing
	// sent; the call fails as when Begin or Send refuse).
	Pick(c *Call, now time.Time, m int) (b int, ok bool)
	// Settle is told, at now, how the call's latest attempt ended, and
	// decides whether to retry (never asked to after c.Attempts reached a
	// limit the kernel knows nothing of: the policy counts).
	Settle(c *Call, now time.Time, o Outcome) Verdict
	// Send is asked when a retry is due, at now: false refuses it (nothing
	// sent, the call fails with the last attempt's status).
	Send(c *Call, now time.Time) bool
	// End is told the call ended, ok or not.
	End(c *Call, now time.Time, ok bool)
}

// Admission is a server policy's decision on an attempt.
type Admission uint8

// The decisions on an attempt.
const (
	// Refused: the attempt is answered at once, with the decision's
	// Outcome.
	Refused Admission = iota
	// Admitted: the attempt goes to the handler (its workers and queue).
	Admitted
	// Held: the attempt waits in the server's own queue, before the
	// handler, holding no worker, until the server decides it (see
	// Server.Decide) or its caller leaves (Server.Leave).
	Held
)

// Server is one backend's server-side policy: what runs before the
// handler.
type Server interface {
	// Admit decides an attempt arriving at now, retry saying whether it
	// says it is one and budgeted whether its client's budget paid for
	// it (the client's word). A refused attempt is answered at once with
	// the returned Outcome.
	Admit(c *Call, now time.Time, retry, budgeted bool) (Admission, Outcome)
	// Decide is asked, at now, about an attempt that Admit held: still
	// Held, or Admitted, or Refused with the Outcome to answer. The kernel
	// asks about a backend's held attempts in the order they arrived,
	// after each Admit and each Done of that backend (when a place may
	// have freed), until one is still held; it does not ask about an
	// attempt whose caller's deadline has come.
	Decide(c *Call, now time.Time) (Admission, Outcome)
	// Leave is told that the caller of an attempt still held left at now
	// (its deadline passed): the attempt is gone, and nothing answers it.
	Leave(c *Call, now time.Time)
	// Done is told how an admitted attempt ended at the handler, at now:
	// its code, and whether its caller had left (its deadline passed)
	// while it ran. It reports whether the server says, with the answer,
	// that its retry budget could not pay for a retry (Outcome.Dry).
	Done(c *Call, now time.Time, code Code, abandoned bool) (dry bool)
}

// Env is what a run gives its policies: the clock's origin, the run's
// random numbers (one goroutine: no locking), and the run's shape.
type Env struct {
	Rand     *rand.Rand
	Base     time.Time
	Backends int
	Clients  int

	suite *suiteRun // what the run's suite clients share (made by the first)
}

// At returns the time d after the run's start.
func (e *Env) At(d time.Duration) time.Time { return e.Base.Add(d) }

// ClientPolicy makes the clients of one setup: one Client per client of
// the fleet.
type ClientPolicy struct {
	// Key names the policy on the command line and in JSON; Name in tables.
	Key, Name string
	// New returns the state of client i.
	New func(e *Env, i int) Client
	// MaxAttempts is the most attempts the policy makes for a call.
	MaxAttempts int
	// MarksRetries says the policy's retries carry their attempt number
	// (grpc-previous-rpc-attempts), so that a server can tell them from
	// first attempts.
	MarksRetries bool
}

// ServerPolicy makes the server side of one setup: one Server per
// backend.
type ServerPolicy struct {
	Key, Name string
	New       func(e *Env, backend int) Server
}
