package overload_test

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/overload"
)

// A method with a standing queue: 40 requests in flight, one ending every
// 5 ms, so each waits 200 ms. A request with 50 ms left is refused on
// arrival; one with a second left is admitted. The example drives the
// Guard at explicit times (the At forms), as a test or a simulator does; a
// server calls the forms without a time, which read the monotonic clock.
func Example() {
	now := time.Unix(1_700_000_000, 0)
	g := overload.New(overload.Config{})
	m := g.Method("/shop.Cart/Get")

	var queue []overload.Ticket
	for range 40 {
		t, _ := m.AdmitAt(now, overload.Request{Deadline: now.Add(time.Minute)})
		queue = append(queue, t)
	}
	for range 400 { // two seconds at 200/s
		now = now.Add(5 * time.Millisecond)
		queue[0].DoneAt(now)
		t, _ := m.AdmitAt(now, overload.Request{Deadline: now.Add(time.Minute)})
		queue = append(queue[1:], t)
	}

	_, d := m.AdmitAt(now, overload.Request{Deadline: now.Add(50 * time.Millisecond)})
	fmt.Println("50ms left:", d.Reason, "retry after:", d.RetryAfter)
	t, d := m.AdmitAt(now, overload.Request{Deadline: now.Add(time.Second)})
	fmt.Println("1s left:", d.Reason)
	t.DoneAt(now)
	// Output:
	// 50ms left: deadline retry after: -1ms
	// 1s left: admitted
}

// With a fixed limit of 4 in flight, retries are shed from 2 on and told
// not to retry; first attempts only at 4, with a pushback.
func ExampleConfig_maxConcurrency() {
	g := overload.New(overload.Config{MaxConcurrency: 4, NoAdaptive: true})
	m := g.Method("/shop.Cart/Get")
	var open []overload.Ticket
	for _, retry := range []bool{false, false, true, false, false, false} {
		t, d := m.Admit(overload.Request{Retry: retry})
		if d.Reason == overload.Admitted {
			open = append(open, t)
		}
		fmt.Printf("retry=%v: %v %v\n", retry, d.Reason, d.RetryAfter)
	}
	for _, t := range open {
		t.Done()
	}
	fmt.Printf("%+v\n", g.Stats())
	// Output:
	// retry=false: admitted 0s
	// retry=false: admitted 0s
	// retry=true: shed_retry -1ms
	// retry=false: admitted 0s
	// retry=false: admitted 0s
	// retry=false: shed_first 100ms
	// {Admitted:4 RefusedDeadline:0 ShedRetry:1 ShedFirst:1 Waited:0 Left:0}
}
