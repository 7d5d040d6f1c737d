package origin

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// Listener is where a test server listens, with what a client needs to
// reach it.
type Listener struct {
	net.Listener
	// Target is the dial target: "127.0.0.1:port" for TCP, a unique
	// "passthrough:///bufconn-N" for bufconn (unique, so that per-target
	// budgets and breakers of different servers do not mix).
	Target string
	dialer func(context.Context, string) (net.Conn, error)
}

var bufconnSeq atomic.Int64

// Bufconn returns an in-memory listener.
func Bufconn() *Listener {
	l := bufconn.Listen(1 << 20)
	return &Listener{
		Listener: l,
		Target:   fmt.Sprintf("passthrough:///bufconn-%d", bufconnSeq.Add(1)),
		dialer:   func(ctx context.Context, _ string) (net.Conn, error) { return l.DialContext(ctx) },
	}
}

// TCP returns a listener on 127.0.0.1 with a free port.
func TCP() (*Listener, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return &Listener{Listener: l, Target: l.Addr().String()}, nil
}

// Dial returns a client connection to the listener: insecure, and with
// grpc's own retries disabled (stormguard does the retrying).
func (l *Listener) Dial(opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient(l.Target, append(l.ConnectOptions(grpc.WithDisableRetry()), opts...)...)
}

// ConnectOptions returns what a grpc.NewClient for l.Target needs
// (insecure credentials, and the in-memory dialer for bufconn), followed by
// opts. Unlike Dial, it leaves grpc's own retries on.
func (l *Listener) ConnectOptions(opts ...grpc.DialOption) []grpc.DialOption {
	base := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if l.dialer != nil {
		base = append(base, grpc.WithContextDialer(l.dialer))
	}
	return append(base, opts...)
}

// Server is a running grpc.Server.
type Server struct {
	*grpc.Server
	Listener *Listener
	done     chan struct{}
	once     sync.Once
}

// Serve registers svc (an EchoService implementation, such as an Origin
// or a Hop) on a new grpc.Server with opts and serves it on l until Stop.
func Serve(l *Listener, svc Registerer, opts ...grpc.ServerOption) *Server {
	s := &Server{Server: grpc.NewServer(opts...), Listener: l, done: make(chan struct{})}
	svc.Register(s.Server)
	go func() {
		defer close(s.done)
		_ = s.Server.Serve(l)
	}()
	return s
}

// Registerer registers a service on a grpc server.
type Registerer interface{ Register(grpc.ServiceRegistrar) }

// Stop stops the server at once (closing open connections and streams)
// and waits for its serving goroutine to end. It is safe to call twice.
func (s *Server) Stop() {
	s.once.Do(s.Server.Stop)
	<-s.done
}
