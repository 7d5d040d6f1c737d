package priority_test

import (
	"context"
	"fmt"

	"github.com/stormguard/stormguard/priority"
)

// A caller marks a prefetch as sheddable; a handler serving a critical
// call inherits its priority in the calls it makes, unless it sets one.
func Example() {
	ctx := priority.NewContext(context.Background(), priority.Sheddable)
	p, _ := priority.FromContext(ctx)
	fmt.Println("prefetch:", p)

	// What a server reads from the header "stormguard-priority".
	p, ok := priority.Parse("critical")
	fmt.Println("header:", p, ok)
	p, ok = priority.Parse("urgent!")
	fmt.Println("unknown header:", p, ok)

	// A hop that sets nothing keeps its caller's; one that sets, its own.
	handler := priority.NewContext(context.Background(), priority.Critical)
	p, _ = priority.FromContext(handler)
	fmt.Println("inherited:", p)
	p, _ = priority.FromContext(priority.NewContext(handler, priority.Default))
	fmt.Println("set by the hop:", p)
	// Output:
	// prefetch: sheddable
	// header: critical true
	// unknown header: default false
	// inherited: critical
	// set by the hop: default
}
