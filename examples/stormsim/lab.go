package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/stormguard/stormguard/examples/internal/fleetsim"
)

// runLab runs the cells the model shares with the storm lab and prints the
// model's figures beside the lab's.
func runLab(w io.Writer) error {
	fmt.Fprintf(w, "stormsim -lab — %s\nThe storm lab's cells in the model, beside the lab's real-gRPC figures (examples/stormlab/README.md, its full run; the fleet's, a run of the fleet alone since the server charges every retry: see README.md); held to ±%.2f× and ±%.1f points unless the last column says why not.\n\n",
		machine(), fleetsim.LabLoadTolerance, fleetsim.LabOKTolerance)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "cell\trow\tmodel\tlab\twithin\t")
	for _, c := range fleetsim.LabCells() {
		res, err := c.Run()
		if err != nil {
			return err
		}
		for _, r := range res {
			within := "yes"
			switch {
			case r.Unchecked != "":
				within = "not held: " + r.Unchecked
			case !r.Within():
				within = "NO"
			}
			fmt.Fprintf(tw, "%s\t%s\t%.3f×, %.1f%%\t%.3f×, %.1f%%\t%s\t\n", c.Name, r.Row.Name, r.Load, r.OK, r.LabLoad, r.LabOK, within)
		}
	}
	return tw.Flush()
}
