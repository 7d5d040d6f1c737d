package outlier

import (
	"errors"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/balancer"
	"google.golang.org/grpc/connectivity"
)

// errEjected is the connection error the child sees for an ejected endpoint.
var errEjected = errors.New("outlier: endpoint ejected for failing more than the others")

// subConn wraps every SubConn the child creates: it links the SubConn to
// its endpoint's counters, and it stands between the SubConn's health
// updates and the child, so that an ejected endpoint looks unhealthy.
type subConn struct {
	balancer.SubConn // the real one

	b *outlierBalancer
	// key is the canonical address (canonicalAddr) the SubConn was created
	// for; "" when it was created for several.
	key string
	// ep is the endpoint the SubConn belongs to, nil if none (an address
	// the resolver did not list). Read on the RPC path.
	ep atomic.Pointer[endpoint]
	// done is the Done callback of its picks, made once.
	done func(balancer.DoneInfo)
	// ready is whether the SubConn's connectivity state is READY.
	ready atomic.Bool

	// The rest is used only while holding b.childMu.
	childListener func(balancer.SubConnState) // the child's state listener
	// healthListener is the child's health listener, nil if none is
	// registered; latest is the last health update from gRPC, and sent
	// whether the child was last told "ejected".
	healthListener func(balancer.SubConnState)
	latest         balancer.SubConnState
	hasLatest      bool
	sentEjected    bool

	// mu guards gen, the generation of the health registration, so that an
	// update of an older registration is dropped.
	mu  sync.Mutex
	gen int
}

// ejected reports whether the SubConn's endpoint is ejected.
func (sc *subConn) ejected() bool {
	ep := sc.ep.Load()
	return ep != nil && ep.ejected.Load()
}

// RegisterHealthListener registers the child's health listener. gRPC's
// updates go through sc, which hides them while the endpoint is ejected.
// The child calls it while handling a state update, so b.childMu is held.
func (sc *subConn) RegisterHealthListener(l func(balancer.SubConnState)) {
	sc.mu.Lock()
	sc.gen++
	gen := sc.gen
	sc.mu.Unlock()
	sc.healthListener = l
	sc.hasLatest = false
	sc.sentEjected = false
	if l == nil {
		sc.SubConn.RegisterHealthListener(nil)
		return
	}
	sc.SubConn.RegisterHealthListener(func(s balancer.SubConnState) {
		sc.mu.Lock()
		stale := sc.gen != gen
		sc.mu.Unlock()
		if stale {
			return
		}
		sc.b.childMu.Lock()
		defer sc.b.childMu.Unlock()
		sc.healthUpdate(s)
	})
}

// healthUpdate records gRPC's health state s and passes it to the child,
// as TRANSIENT_FAILURE while the endpoint is ejected. b.childMu is held.
func (sc *subConn) healthUpdate(s balancer.SubConnState) {
	sc.latest, sc.hasLatest = s, true
	if sc.healthListener == nil || sc.b.isClosed() {
		return
	}
	if sc.ejected() && s.ConnectivityState == connectivity.Ready {
		sc.sentEjected = true
		sc.healthListener(balancer.SubConnState{ConnectivityState: connectivity.TransientFailure, ConnectionError: errEjected})
		return
	}
	sc.sentEjected = false
	sc.healthListener(s)
}

// syncEjection tells the child the SubConn's endpoint was ejected or
// un-ejected, if its view differs. b.childMu is held.
func (sc *subConn) syncEjection() {
	if sc.healthListener == nil || !sc.hasLatest || sc.b.isClosed() {
		return
	}
	ej := sc.ejected()
	switch {
	case ej && !sc.sentEjected && sc.latest.ConnectivityState == connectivity.Ready:
		sc.sentEjected = true
		sc.healthListener(balancer.SubConnState{ConnectivityState: connectivity.TransientFailure, ConnectionError: errEjected})
	case !ej && sc.sentEjected:
		sc.sentEjected = false
		sc.healthListener(sc.latest)
	}
}

// stateUpdate passes gRPC's connectivity state to the child. A new state
// ends the health registration: the child registers again on READY.
func (sc *subConn) stateUpdate(s balancer.SubConnState) {
	sc.ready.Store(s.ConnectivityState == connectivity.Ready)
	sc.b.childMu.Lock()
	defer sc.b.childMu.Unlock()
	sc.mu.Lock()
	sc.gen++
	sc.mu.Unlock()
	sc.healthListener, sc.hasLatest, sc.sentEjected = nil, false, false
	if s.ConnectivityState == connectivity.Shutdown {
		sc.b.forget(sc)
	}
	if sc.childListener != nil && !sc.b.isClosed() {
		sc.childListener(s)
	}
}
