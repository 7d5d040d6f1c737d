package fleetsim

import "time"

// Window counts what the calls due in a part of the run did: the calls,
// those that succeeded, their attempts sent, and those that reached the
// handler (past the server policy).
type Window struct {
	From, To time.Duration
	Calls    int `json:"calls"`
	OK       int `json:"ok"`
	Sent     int `json:"sent"`
	Handled  int `json:"handled"`
}

// Load is the attempts sent per call (the client side's amplification).
func (w Window) Load() float64 { return ratio(w.Sent, w.Calls) }

// HandlerLoad is the attempts that reached the handler per call.
func (w Window) HandlerLoad() float64 { return ratio(w.Handled, w.Calls) }

// OKPercent is the share of the calls that succeeded, in percent.
func (w Window) OKPercent() float64 { return 100 * ratio(w.OK, w.Calls) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Result is what a run measured.
type Result struct {
	// Policy is the row's key (the client policy's, for a lone run),
	// Name its name; Server the server policy's key ("" for plain
	// servers).
	Policy, Name, Server string
	Clients              int
	// Window is the failure (the whole run when healthy); First its first
	// Settle, After the rest; All the whole run. Calls belong to the
	// part in which they were due.
	Window, First, After, All Window
	// Recovery is the time from the failure's end until every later step
	// had at least RecoveredShare of its calls succeed; -1: never. Ended
	// says whether the failure ended within the run (else Recovery means
	// nothing).
	Recovery time.Duration
	Ended    bool
	// BurstPerClient is the attempts sent over the failure beyond 1.10×
	// its calls, per client of the fleet; MaxRetries the most retries one
	// client sent over the failure.
	BurstPerClient float64
	MaxRetries     int
	// RefusedFirst and RefusedRetry count what the clients refused
	// themselves: calls refused before their first attempt, retries
	// refused when due. ServerRefused counts attempts the server policy
	// refused; Wasted the requests the handler completed after their
	// caller had left.
	RefusedFirst, RefusedRetry, ServerRefused, Wasted int
	// ServerHeld counts the attempts the server policy held in its own
	// queue before deciding them (the suite's server at an engaged
	// adaptive limit), ServerLeft those of them whose callers left while
	// held (neither admitted nor refused).
	ServerHeld, ServerLeft int
	// Codes counts how the calls ended, by code.
	Codes map[string]int
	// Series is the run over time, one entry per Step: the calls due in
	// it and those of them that succeeded, and the attempts sent and
	// handled in it.
	Step                       time.Duration
	Calls, OK, Sent, HandledAt []int
	FailureStart, FailureEnd   time.Duration
	Wall                       time.Duration
	Events                     int
}

// RecoveredShare is the share of a step's calls that must succeed for
// the step to count as recovered.
const RecoveredShare = 0.9

// perClient counts a client's calls due in the failure, and their
// attempts.
type perClient struct{ calls, sent int32 }

// meter counts a run as it goes.
type meter struct {
	step             int64
	from, settle, to int64       // the failure window, by due time
	calls, ok        []int       // by due step
	sentDue, handDue []int       // by due step
	sentAt, handAt   []int       // by the step they happened in
	pc               []perClient // by client
	codes            [4]int
	refusedFirst     int
	refusedRetry     int
	serverRefused    int
	serverHeld       int
	serverLeft       int
	wasted           int
	clients          int
}

func newMeter(cfg *Config, clients int) *meter {
	n := int((cfg.Duration+cfg.Deadline)/cfg.Step) + 2
	m := &meter{
		step: int64(cfg.Step), calls: make([]int, n), ok: make([]int, n), sentDue: make([]int, n), handDue: make([]int, n),
		sentAt: make([]int, n), handAt: make([]int, n), clients: clients,
		pc: make([]perClient, clients),
	}
	m.from, m.to = 0, int64(cfg.Duration)
	if f := cfg.Failure; f.Mode != Healthy {
		m.from, m.to = int64(f.Start), min(int64(f.End), int64(cfg.Duration))
	}
	m.settle = min(m.from+int64(cfg.Settle), m.to)
	return m
}

func (m *meter) idx(t int64) int { return min(int(t/m.step), len(m.calls)-1) }

func (m *meter) in(c *Call) bool { return c.due >= m.from && c.due < m.to }

func (m *meter) call(c *Call) {
	m.calls[m.idx(c.due)]++
	if m.in(c) {
		m.pc[c.Client].calls++
	}
}

func (m *meter) sent(c *Call, now int64) {
	m.sentDue[m.idx(c.due)]++
	m.sentAt[m.idx(now)]++
	if m.in(c) {
		m.pc[c.Client].sent++
	}
}

func (m *meter) handled(c *Call, now int64) {
	m.handDue[m.idx(c.due)]++
	m.handAt[m.idx(now)]++
}

func (m *meter) end(c *Call, _ int64, code Code) {
	m.codes[code]++
	if code == OK {
		m.ok[m.idx(c.due)]++
	}
}

// window sums the due-step counts of the calls due in [from, to).
func (m *meter) window(from, to int64) Window {
	w := Window{From: time.Duration(from), To: time.Duration(to)}
	for i := m.idx(from); i < len(m.calls) && int64(i)*m.step < to; i++ {
		w.Calls += m.calls[i]
		w.OK += m.ok[i]
		w.Sent += m.sentDue[i]
		w.Handled += m.handDue[i]
	}
	return w
}

func (m *meter) result(cfg *Config) *Result {
	r := &Result{
		Policy: cfg.Client.Key, Name: cfg.Client.Name, Clients: m.clients, Step: cfg.Step,
		Window: m.window(m.from, m.to), First: m.window(m.from, m.settle), After: m.window(m.settle, m.to),
		All:          m.window(0, int64(cfg.Duration)),
		RefusedFirst: m.refusedFirst, RefusedRetry: m.refusedRetry, ServerRefused: m.serverRefused, Wasted: m.wasted,
		ServerHeld: m.serverHeld, ServerLeft: m.serverLeft,
		Codes: map[string]int{}, FailureStart: time.Duration(m.from), FailureEnd: time.Duration(m.to),
		Calls: m.calls, OK: m.ok, Sent: m.sentAt, HandledAt: m.handAt, Recovery: -1,
	}
	if cfg.Server != nil {
		r.Server = cfg.Server.Key
	}
	for c, n := range m.codes {
		if n > 0 {
			r.Codes[Code(c).String()] = n
		}
	}
	w := r.Window
	r.BurstPerClient = (float64(w.Sent) - 1.1*float64(w.Calls)) / float64(max(m.clients, 1))
	for _, pc := range m.pc {
		r.MaxRetries = max(r.MaxRetries, int(pc.sent-pc.calls))
	}
	if cfg.Failure.Mode != Healthy && cfg.Failure.End < cfg.Duration {
		r.Ended = true
		r.Recovery = m.recovery(int64(cfg.Failure.End), int64(cfg.Duration))
	}
	return r
}

// recovery returns the time from end until every later step (of the
// calls due before stop) had at least RecoveredShare of its calls
// succeed, or -1 if the last step did not.
func (m *meter) recovery(end, stop int64) time.Duration {
	last := m.idx(end) // the first step after the failure that counts
	for i := m.idx(end); int64(i)*m.step < stop && i < len(m.calls); i++ {
		if m.calls[i] > 0 && float64(m.ok[i]) < RecoveredShare*float64(m.calls[i]) {
			last = i + 1
		}
	}
	if int64(last)*m.step >= stop {
		return -1
	}
	return time.Duration(max(0, int64(last)*m.step-end))
}
