package breaker_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// Example drives a breaker at explicit times (the At forms), as a test or
// a simulator does; a client calls the forms without a time, which read
// the monotonic clock.
func Example() {
	now := time.Unix(0, 0)
	b := breaker.NewRegistry(breaker.Config{
		FailureRatio: 0.5, // open once half the attempts in the window failed (default: all)
		MinAttempts:  4,   // and there were at least 4
		Jitter:       -1,  // (no jitter, so the output is exact)
		OnStateChange: func(target string, from, to breaker.State) {
			fmt.Printf("%s: %v -> %v\n", target, from, to)
		},
	}).For("payments:443") // a Registry names its breakers by their target

	call := func(fail bool) {
		t, err := b.AdmitAt(now)
		if errors.Is(err, breaker.ErrOpen) {
			fmt.Printf("refused, retry after %v\n", b.RetryAfterAt(now))
			return
		}
		t.DoneAt(fail, now)
	}
	call(false)
	call(true)
	call(false)
	call(true) // 2 of 4 failed: opens
	call(false)

	now = now.Add(time.Second) // OpenTimeout (default 1s): one probe may pass
	call(false)                // it succeeds: closes
	fmt.Println(b.StateAt(now))
	// Output:
	// payments:443: closed -> open
	// refused, retry after 1s
	// payments:443: open -> half-open
	// payments:443: half-open -> closed
	// closed
}

// Admit and Ticket are the allocation-free form of Allow, for callers that
// keep the pending outcome in a struct, and the way to report an attempt
// that says nothing about the target.
func ExampleBreaker_Admit() {
	b := breaker.New(breaker.Config{})

	type attempt struct {
		ticket breaker.Ticket
		// ...
	}
	var a attempt
	var err error
	if a.ticket, err = b.Admit(); err != nil {
		return // ErrOpen: do not make the attempt
	}
	cancelledByCaller := true
	if cancelledByCaller {
		a.ticket.Ignore() // neither a success nor a failure
	} else {
		a.ticket.Done(false)
	}
	a.ticket.Done(true) // already reported: no effect
	fmt.Println("counted:", b.Stats().Attempts)
	// Output: counted: 0
}

func ExampleRegistry() {
	r := breaker.NewRegistry(breaker.Config{ConsecutiveFailures: 1, Jitter: -1})
	done, _ := r.For("db:5432").Allow()
	done(true)
	r.For("cache:6379")

	for _, target := range []string{"cache:6379", "db:5432"} {
		fmt.Println(target, r.For(target).State())
	}
	open := 0
	r.Range(func(target string, b *breaker.Breaker) bool {
		if b.State() == breaker.StateOpen {
			open++
		}
		return true
	})
	fmt.Println("open:", open)
	// Output:
	// cache:6379 closed
	// db:5432 open
	// open: 1
}
