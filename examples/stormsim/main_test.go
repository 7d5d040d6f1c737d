package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func runArgs(t *testing.T, args ...string) string {
	t.Helper()
	o, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(o, &out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// TestTable prints a row per policy by default, the suite's among them.
func TestTable(t *testing.T) {
	out := runArgs(t, "-clients", "100", "-rate", "2", "-seconds", "20", "-from", "5s", "-for", "10s")
	for _, want := range []string{"no retries", "grpc-go + retryThrottling", "AWS SDK standard, 2026", "Envoy", "Finagle", "SRE", "stormguard defaults", "grpc-go retryPolicy, stormguard server"} {
		if !strings.Contains(out, want) {
			t.Errorf("no row %q in\n%s", want, out)
		}
	}
}

// TestJSONCSVAndSVG: -json is valid JSON with a row per policy and its
// series; -csv and -svg write their files.
func TestJSONCSVAndSVG(t *testing.T) {
	dir := t.TempDir()
	out := runArgs(t, "-clients", "50", "-rate", "2", "-seconds", "20", "-from", "5s", "-for", "10s", "-failure", "outage",
		"-rows", "none,grpc,suite", "-json", "-csv", dir+"/t.csv", "-svg", dir+"/t.svg")
	var rep struct {
		Rows []struct {
			Key     string `json:"key"`
			Failure struct {
				Calls int     `json:"calls"`
				Load  float64 `json:"load"`
			} `json:"failure"`
			Series struct {
				Calls []int `json:"calls"`
			} `json:"series"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Rows) != 3 || rep.Rows[1].Key != "grpc" || rep.Rows[1].Failure.Load < 2.9 || len(rep.Rows[0].Series.Calls) == 0 {
		t.Errorf("rows %+v", rep.Rows)
	}
	csv := readFile(t, dir+"/t.csv")
	if n := strings.Count(csv, "\n"); n != 4 {
		t.Errorf("%d CSV lines, want a header and 3 rows:\n%s", n, csv)
	}
	svg := readFile(t, dir+"/t.svg")
	if err := xml.Unmarshal([]byte(svg), new(struct{})); err != nil || !strings.Contains(svg, "<polyline") {
		t.Errorf("not an SVG with lines (%v)", err)
	}
}

// TestBadFlags are refused.
func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-failure", "flood"}, {"-rate", "0"}, {"-mix", "ten"}, {"-rows", "nope"}, {"extra"}} {
		o, err := parseFlags(args, io.Discard)
		if err == nil {
			err = run(o, io.Discard)
		}
		if err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
