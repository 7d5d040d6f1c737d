// Package redistest runs a real redis-server for tests: on a free
// loopback port, with a temporary directory, no persistence unless asked,
// and no system service.
//
// When the redis-server binary is missing, tests are skipped with a clear
// message, unless the CI environment variable is set: then they fail, so
// that CI never passes without having run them.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Binary is the redis-server binary looked up in PATH.
const Binary = "redis-server"

// Missing returns why redis-server cannot run here, or "" when it can.
func Missing() string {
	if _, err := exec.LookPath(Binary); err != nil {
		return "redis-server not found in PATH (apt-get install redis-server)"
	}
	return ""
}

// Require skips t when redis-server is missing, or fails it when the CI
// environment variable is set.
func Require(t testing.TB) {
	t.Helper()
	if why := Missing(); why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s; CI is set, so this is a failure, not a skip", why)
		}
		t.Skipf("skipping: %s", why)
	}
}

// Server is a running redis-server.
type Server struct {
	// Addr is its "127.0.0.1:port".
	Addr string
	dir  string
	args []string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Start starts a redis-server with extra configuration args (such as
// "--maxmemory", "16mb") and stops it when t ends. It skips or fails t as
// Require does when the binary is missing.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	Require(t)
	s, err := start(t.TempDir(), args)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StartMain is Start for TestMain, where no testing.T can stop the server:
// it returns the server (the caller calls its Stop) or an error.
func StartMain(dir string, args ...string) (*Server, error) { return start(dir, args) }

func start(dir string, extra []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), dir: dir}
	s.args = append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no",
		"--loglevel", "warning", "--logfile", "", "--protected-mode", "yes",
		"--databases", "1",
	}, extra...)
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) launch() error {
	out, err := os.OpenFile(filepath.Join(s.dir, "redis-server.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close() // the child has its own descriptor
	cmd := exec.Command(Binary, s.args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return err
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := s.ping(); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("redis-server on %s did not answer PING within 10s: %s", s.Addr, s.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ping sends PING over a raw connection.
func (s *Server) ping() error {
	c, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return errors.New("redis-server answered " + line)
	}
	return nil
}

// Stop stops the server (SIGTERM, then SIGKILL after 5s) and waits for it.
// It is safe to call twice.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // in case it was paused
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Kill stops the server at once with SIGKILL, as a crash would, and waits
// for it.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// Restart starts the server again on the same port and directory, after
// Stop or Kill.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.launch(); err != nil {
		t.Fatal(err)
	}
}

// Pause stops the process (SIGSTOP): connections stay open and commands
// get no answer, as with a Redis stuck in a long command or a swap storm.
func (s *Server) Pause(t testing.TB) { s.signal(t, syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume(t testing.TB) { s.signal(t, syscall.SIGCONT) }

// PauseFor pauses the server (SIGSTOP) and resumes it d later (SIGCONT)
// without waiting: a Redis that stalls and comes back on its own, with
// nothing lost. Unlike Pause it may be called from any goroutine (a
// handler, a hook); a failure to signal fails t with Error.
func (s *Server) PauseFor(t testing.TB, d time.Duration) {
	if err := s.send(syscall.SIGSTOP); err != nil {
		t.Error(err)
		return
	}
	resume := time.AfterFunc(d, func() { _ = s.send(syscall.SIGCONT) })
	t.Cleanup(func() {
		if resume.Stop() {
			_ = s.send(syscall.SIGCONT)
		}
	})
}

func (s *Server) signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if err := s.send(sig); err != nil {
		t.Fatal(err)
	}
}

// send sends sig to the running server.
func (s *Server) send(sig os.Signal) error {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return errors.New("redis-server is not running")
	}
	return cmd.Process.Signal(sig)
}

// Log returns the server's output so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis-server.out"))
	return string(b)
}
