package fleetsim

import "testing"

// TestFaithfulToTheLab runs the cells the model shares with the storm lab
// and holds each row to the lab's figures: load within ±0.02× and ok %
// within ±1.5 points, but for the rows the model says it cannot match.
func TestFaithfulToTheLab(t *testing.T) {
	for _, c := range LabCells() {
		res, err := c.Run()
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			t.Logf("%s, %s: model %.3f×, %.1f%%; lab %.3f×, %.1f%% %s", c.Name, r.Row.Name, r.Load, r.OK, r.LabLoad, r.LabOK, r.Unchecked)
			if r.Unchecked == "" && !r.Within() {
				t.Errorf("%s, %s: model %.3f×, %.1f%%, lab %.3f×, %.1f%%: want within ±%.2f× and ±%.1f points",
					c.Name, r.Row.Name, r.Load, r.OK, r.LabLoad, r.LabOK, LabLoadTolerance, LabOKTolerance)
			}
		}
	}
}
