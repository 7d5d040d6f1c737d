package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/stormguard/stormguard/examples/internal/fleetsim"
)

// memoryClients is how many clients' state -memory measures at once.
const memoryClients = 100_000

// runMemory prints each client policy's state memory per client: the heap
// that memoryClients clients' state holds, ÷ memoryClients, the least of
// three measurements.
func runMemory(w io.Writer) error {
	fmt.Fprintf(w, "stormsim — %s\nState memory per client: the heap %s clients of a policy hold (the least of 3 measurements), and the kernel's own per client.\n\n", machine(), count(memoryClients))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tbytes per client\t")
	for _, p := range append(fleetsim.Rivals(), fleetsim.PolicySuite()) {
		fmt.Fprintf(tw, "%s\t%.0f\t\n", p.Name, fleetsim.StateBytes(p, memoryClients, 3))
	}
	b, br := fleetsim.LibraryBytes(memoryClients, 3)
	fmt.Fprintf(tw, "%s\t%.0f\t\n", "  of which budget.Budget", b)
	fmt.Fprintf(tw, "%s\t%.0f\t\n", "  of which breaker.Breaker", br)
	fmt.Fprintf(tw, "%s\t%d\t\n", "the kernel (the client's slot, phase, counters)", fleetsim.KernelBytesPerClient)
	return tw.Flush()
}
