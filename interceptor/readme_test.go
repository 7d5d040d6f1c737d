package interceptor_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeProgramIsExample checks that the complete program in README.md
// is the body of Example, line for line, so that what a reader pastes is
// what the tests run.
func TestReadmeProgramIsExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	program := regexp.MustCompile("(?s)\nfunc main\\(\\) \\{\n(.*?)\n\\}\n```").FindSubmatch(readme)
	if program == nil {
		t.Fatal("README.md has no Go program with func main")
	}
	example := regexp.MustCompile("(?s)\nfunc Example\\(\\) \\{\n(.*?)\n\\}\n").FindSubmatch(src)
	if example == nil {
		t.Fatal("example_test.go has no func Example")
	}
	var body []string
	for _, line := range strings.Split(string(example[1]), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "// Output:") {
			body = append(body, line)
		}
	}
	if got, want := string(program[1]), strings.Join(body, "\n"); got != want {
		t.Errorf("README.md's main differs from Example's body:\n--- README\n%s\n--- Example\n%s", got, want)
	}
}
