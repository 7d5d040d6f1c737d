package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// readmeVerdicts returns the verdict table of README.md's grid: per
// "failure | fleet", the verdict, in order.
func readmeVerdicts(t *testing.T) (keys []string, verdicts map[string]string) {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	verdicts = map[string]string{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "| failure | fleet |"):
			in = true
		case in && strings.HasPrefix(line, "| ---"):
		case in && strings.HasPrefix(line, "|"):
			f := strings.Split(strings.Trim(line, "| "), " | ")
			if len(f) != 5 {
				t.Fatalf("README verdict line %q: %d fields, want 5", line, len(f))
			}
			k := f[0] + " | " + f[1]
			keys = append(keys, k)
			verdicts[k] = f[4]
		case in:
			return keys, verdicts
		}
	}
	return keys, verdicts
}

// TestGridVerdicts runs the grid and holds it to the README: every cell's
// verdict is the one the README prints, the suite is dominated in no cell
// (no rival that sends no more load has an ok % higher by more than half a
// point), and it is better than the best rival within 1.10× in as many
// cells as the README says. The runs are deterministic; a change of the
// library, the model or a rival that moves a verdict fails here until the
// README (and what it says of why) is brought up to date.
func TestGridVerdicts(t *testing.T) {
	if raceEnabled {
		t.Skip("the grid is 252 runs: minutes under the race detector; CI runs it without (.ci/run)")
	}
	cells, err := runGridCells()
	if err != nil {
		t.Fatal(err)
	}
	keys, want := readmeVerdicts(t)
	if len(keys) != len(cells) {
		t.Fatalf("README has %d verdicts, the grid %d cells", len(keys), len(cells))
	}
	wins := 0
	for i, c := range cells {
		k := c.mode + " | " + c.shape
		if keys[i] != k {
			t.Errorf("cell %d is %q, the README's %q", i, k, keys[i])
		}
		if got := c.verdict.String(); got != want[k] {
			t.Errorf("%s: verdict %q, the README says %q", k, got, want[k])
		}
		if c.verdict.dominatedBy != "" {
			t.Errorf("%s: the suite is dominated by %s", k, c.verdict.dominatedBy)
		}
		if c.verdict.win {
			wins++
		}
	}
	var out bytes.Buffer
	writeGrid(&out, cells)
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	summary := strings.TrimSpace(out.String()[strings.LastIndex(out.String(), "\nThe suite is better"):])
	if !bytes.Contains(readme, []byte(summary)) {
		t.Errorf("the README does not say %q", summary)
	}
	t.Logf("the suite is better than the best rival in %d of %d cells", wins, len(cells))
}
