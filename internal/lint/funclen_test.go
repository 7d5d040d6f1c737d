package lint

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// maxFuncLines is the longest a library function may be, from its func
// line to its closing brace.
const maxFuncLines = 80

// rootModule is the module path of the repository's root.
const rootModule = "github.com/stormguard/stormguard"

// skippedDirs are the directories, relative to the root, whose code is not
// the library's.
var skippedDirs = []string{"examples", "bench", "tools"}

// repoRoot returns the directory of the root module's go.mod, found by
// walking up from the working directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if modulePath(filepath.Join(dir, "go.mod")) == rootModule {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod of %s above the working directory", rootModule)
		}
		dir = parent
	}
}

// modulePath returns the module path a go.mod declares, "" if none.
func modulePath(gomod string) string {
	f, err := os.Open(gomod)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "module "); ok {
			return strings.Trim(strings.TrimSpace(m), `"`)
		}
	}
	return ""
}

// libraryFiles returns the library's Go files under root, relative to it:
// every module's (nested ones too) but those under skippedDirs, test files,
// testdata, hidden directories and generated files.
func libraryFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		name := d.Name()
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
				name == "testdata" || name == "vendor" || slices.Contains(skippedDirs, rel)) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go") && !strings.HasSuffix(name, ".pb.go") {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// longFuncs returns the functions and function literals of a file that
// are longer than maxFuncLines, as "path:line: name is n lines"; nothing
// for a generated file.
func longFuncs(fset *token.FileSet, rel string, f *ast.File) []string {
	if ast.IsGenerated(f) {
		return nil
	}
	var long []string
	check := func(node ast.Node, name string) {
		start, end := fset.Position(node.Pos()).Line, fset.Position(node.End()).Line
		if n := end - start + 1; n > maxFuncLines {
			long = append(long, fmt.Sprintf("%s:%d: %s is %d lines", rel, start, name, n))
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch fn := n.(type) {
		case *ast.FuncDecl:
			check(fn, funcName(fn))
		case *ast.FuncLit:
			check(fn, "a function literal")
		}
		return true
	})
	return long
}

// funcName names a function declaration as go doc does: Name, or
// (Recv).Name for a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	var recv strings.Builder
	var typ func(ast.Expr)
	typ = func(e ast.Expr) {
		switch e := e.(type) {
		case *ast.StarExpr:
			recv.WriteString("*")
			typ(e.X)
		case *ast.Ident:
			recv.WriteString(e.Name)
		case *ast.IndexExpr:
			typ(e.X)
		case *ast.IndexListExpr:
			typ(e.X)
		}
	}
	typ(fn.Recv.List[0].Type)
	return "(" + recv.String() + ")." + fn.Name.Name
}

// TestNoLongFunctions fails naming every library function longer than
// maxFuncLines lines: non-test, non-generated code of every module in the
// repository outside examples/, bench/ and tools/.
func TestNoLongFunctions(t *testing.T) {
	root := repoRoot(t)
	files := libraryFiles(t, root)
	// The walk must reach the root module's packages and the nested
	// modules' ones, or the test proves nothing.
	for _, want := range []string{"outlier/detect.go", "idempotency/redisstore/store.go"} {
		if !slices.Contains(files, want) {
			t.Fatalf("the walk of %s did not reach %s", root, want)
		}
	}
	fset := token.NewFileSet()
	var long []string
	for _, rel := range files {
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		long = append(long, longFuncs(fset, rel, f)...)
	}
	for _, l := range long {
		t.Errorf("%s; at most %d allowed", l, maxFuncLines)
	}
	t.Logf("%d library files checked", len(files))
}
