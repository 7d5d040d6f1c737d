package lint

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestLibraryDoesNotImportExamples fails naming every library file, tests
// included, that imports a package under examples/, bench/ or tools/: the
// library and its test machinery must build without them. It also fails
// when the root go.mod requires an OpenTelemetry exporter, which only the
// examples (modules of their own) need.
func TestLibraryDoesNotImportExamples(t *testing.T) {
	root := repoRoot(t)
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "vendor" || slices.Contains(skippedDirs, rel)) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(files, "internal/origin/origin.go") || !slices.Contains(files, "interceptor/engine_test.go") {
		t.Fatalf("the walk of %s did not reach the library's files and tests", root)
	}
	fset := token.NewFileSet()
	for _, rel := range files {
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, dir := range skippedDirs {
				if p := rootModule + "/" + dir; path == p || strings.HasPrefix(path, p+"/") {
					t.Errorf("%s imports %s", rel, path)
				}
			}
		}
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(gomod), "go.opentelemetry.io/otel/exporters/") {
		t.Error("the root go.mod requires an OpenTelemetry exporter")
	}
	t.Logf("%d files checked", len(files))
}
