package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// userProto is a user's service annotated with stormguard's options, one
// method per policy.
const userProto = `syntax = "proto3";

package shop.v1;

import "stormguard/v1/options.proto";

option go_package = "example.com/shop/gen/shop/v1;shopv1";

service ShopService {
  // A read: retried, and hedged 20 ms after the last attempt.
  rpc GetItem(GetItemRequest) returns (GetItemResponse) {
    option idempotency_level = NO_SIDE_EFFECTS;
    option (stormguard.v1.method) = {
      hedging_delay: { nanos: 20000000 }
    };
  }
  // A read hedged after an adaptive delay (an empty hedging_delay).
  rpc SearchItems(SearchItemsRequest) returns (stream SearchItemsResponse) {
    option idempotency_level = NO_SIDE_EFFECTS;
    option (stormguard.v1.method) = {
      hedging_delay: {}
    };
  }
  // A write that may be repeated: retried, up to 5 attempts of 1 s each.
  rpc UpdateItem(UpdateItemRequest) returns (UpdateItemResponse) {
    option idempotency_level = IDEMPOTENT;
    option (stormguard.v1.method) = {
      max_attempts: 5
      per_attempt_timeout: { seconds: 1 }
    };
  }
  // A write the server deduplicates: retried with an idempotency key.
  rpc PlaceOrder(PlaceOrderRequest) returns (PlaceOrderResponse) {
    option (stormguard.v1.method) = {
      retry_with_key: true
    };
  }
  // Unmarked: sent exactly once.
  rpc SendReceipt(SendReceiptRequest) returns (SendReceiptResponse);
}

message Item {
  string id = 1;
}

message GetItemRequest {
  string id = 1;
}

message GetItemResponse {
  Item item = 1;
}

message SearchItemsRequest {
  string query = 1;
}

message SearchItemsResponse {
  Item item = 1;
}

message UpdateItemRequest {
  Item item = 1;
}

message UpdateItemResponse {
  Item item = 1;
}

message PlaceOrderRequest {
  string item_id = 1;
}

message PlaceOrderResponse {
  string order_id = 1;
}

message SendReceiptRequest {
  string order_id = 1;
}

message SendReceiptResponse {}
`

// userMain prints what idempotency.Lookup resolves for each method of the
// user's service, once its generated code is linked in.
const userMain = `package main

import (
	"fmt"

	"github.com/stormguard/stormguard/idempotency"

	_ "example.com/shop/gen/shop/v1" // registers shop/v1/shop.proto
)

func main() {
	for _, m := range []string{"GetItem", "SearchItems", "UpdateItem", "PlaceOrder", "SendReceipt", "NoSuchMethod"} {
		p := idempotency.Lookup("/shop.v1.ShopService/" + m)
		fmt.Printf("%s level=%s known=%t hedging=%t hedging_delay=%s max_attempts=%d per_attempt_timeout=%s server_streaming=%t\n",
			m, p.Level, p.Known, p.Hedging, p.HedgingDelay, p.MaxAttempts, p.PerAttemptTimeout, p.ServerStreaming)
	}
}
`

// wantLookup is what userMain must print.
const wantLookup = `GetItem level=NO_SIDE_EFFECTS known=true hedging=true hedging_delay=20ms max_attempts=0 per_attempt_timeout=0s server_streaming=false
SearchItems level=NO_SIDE_EFFECTS known=true hedging=true hedging_delay=0s max_attempts=0 per_attempt_timeout=0s server_streaming=true
UpdateItem level=IDEMPOTENT known=true hedging=false hedging_delay=0s max_attempts=5 per_attempt_timeout=1s server_streaming=false
PlaceOrder level=RETRY_WITH_KEY known=true hedging=false hedging_delay=0s max_attempts=0 per_attempt_timeout=0s server_streaming=false
SendReceipt level=UNMARKED known=true hedging=false hedging_delay=0s max_attempts=0 per_attempt_timeout=0s server_streaming=false
NoSuchMethod level=UNMARKED known=false hedging=false hedging_delay=0s max_attempts=0 per_attempt_timeout=0s server_streaming=false
`

// TestUserProtoOptions compiles a user's .proto that imports
// stormguard/v1/options.proto the two ways docs/annotating.md tells users
// to: buf, with this module's proto directory in the workspace (found with
// `go list -m -f {{.Dir}}`), and protoc with it as an include path. Each
// generates Go code into a temporary module that requires this one (by a
// replace), and a program there prints idempotency.Lookup of every method.
//
// The tools are this repository's: buf and protoc-gen-go from tools/go.mod,
// protoc from the system (Debian's protobuf-compiler and libprotobuf-dev).
// Outside CI a missing tool skips its part; under CI (CI set) it fails.
func TestUserProtoOptions(t *testing.T) {
	if testing.Short() {
		t.Skip("builds tools and a program")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	missing := func(t *testing.T, format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") != "" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format+" (skipped outside CI)", args...)
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		missing(t, "no go command: %v", err)
	}
	root := strings.TrimSpace(run(t, ctx, "", nil, gobin, "list", "-m", "-f", "{{.Dir}}"))
	tool := func(name string) string {
		out, err := command(ctx, root, nil, gobin, "tool", "-modfile=tools/go.mod", "-n", name)
		if err != nil {
			missing(t, "cannot build %s from tools/go.mod: %v\n%s", name, err, out)
		}
		return strings.TrimSpace(out)
	}
	protocGenGo := tool("protoc-gen-go")

	t.Run("buf", func(t *testing.T) {
		buf := tool("buf")
		dir := userModule(t, ctx, gobin, root)
		include := stormguardDir(t, ctx, gobin, dir, root)
		// The recipe: stormguard's proto directory becomes a module of the
		// user's buf workspace through a symlink, and only the user's own
		// module is generated.
		mkdirs(t, filepath.Join(dir, "third_party"))
		if err := os.Symlink(filepath.Join(include, "proto"), filepath.Join(dir, "third_party", "stormguard")); err != nil {
			t.Fatal(err)
		}
		write(t, filepath.Join(dir, "buf.yaml"), `version: v2
modules:
  - path: proto
  - path: third_party/stormguard
`)
		write(t, filepath.Join(dir, "buf.gen.yaml"), `version: v2
plugins:
  - local: `+protocGenGo+`
    out: .
    opt: module=example.com/shop
inputs:
  - directory: proto
`)
		run(t, ctx, dir, nil, buf, "build")
		run(t, ctx, dir, nil, buf, "lint", "proto")
		run(t, ctx, dir, nil, buf, "generate")
		checkGenerated(t, ctx, gobin, dir)
	})

	t.Run("protoc", func(t *testing.T) {
		protoc, err := exec.LookPath("protoc")
		if err != nil {
			missing(t, "no protoc (apt-get install protobuf-compiler libprotobuf-dev): %v", err)
		}
		dir := userModule(t, ctx, gobin, root)
		include := stormguardDir(t, ctx, gobin, dir, root)
		run(t, ctx, dir, nil, protoc,
			"-I", "proto",
			"-I", filepath.Join(include, "proto"),
			"--plugin=protoc-gen-go="+protocGenGo,
			"--go_out=.", "--go_opt=module=example.com/shop",
			"proto/shop/v1/shop.proto")
		checkGenerated(t, ctx, gobin, dir)
	})
}

// userModule writes the user's module into a new directory: go.mod
// requiring this module through a replace, the .proto and the program.
//
// The user's go.mod requires what this module's go.mod requires, at the same
// versions, and its go.sum is this module's: the user's build list is this
// module's, so every module it needs is one that a `go test` of this module
// has already downloaded, and the go command never needs the network
// (goEnv turns it off). A user would run `go mod tidy` instead; tidy here
// would also want the modules that only the tests of this module's
// dependencies import (grpc's tests import go-cmp, gonum...), which no step
// before this test is bound to have downloaded.
func userModule(t *testing.T, ctx context.Context, gobin, root string) string {
	t.Helper()
	dir := t.TempDir()
	var mod struct {
		Go      string
		Require []struct{ Path, Version string }
	}
	if err := json.Unmarshal([]byte(run(t, ctx, root, goEnv, gobin, "mod", "edit", "-json")), &mod); err != nil {
		t.Fatalf("go mod edit -json in %s: %v", root, err)
	}
	var gomod strings.Builder
	fmt.Fprintf(&gomod, "module example.com/shop\n\ngo %s\n\nrequire (\n", mod.Go)
	gomod.WriteString("\tgithub.com/stormguard/stormguard v0.0.0-00010101000000-000000000000\n")
	for _, r := range mod.Require {
		fmt.Fprintf(&gomod, "\t%s %s\n", r.Path, r.Version)
	}
	fmt.Fprintf(&gomod, ")\n\nreplace github.com/stormguard/stormguard => %s\n", root)
	write(t, filepath.Join(dir, "go.mod"), gomod.String())
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "go.sum"), string(sum))
	mkdirs(t, filepath.Join(dir, "proto", "shop", "v1"))
	write(t, filepath.Join(dir, "proto", "shop", "v1", "shop.proto"), userProto)
	write(t, filepath.Join(dir, "main.go"), userMain)
	return dir
}

// stormguardDir runs the docs' `go list -m -f {{.Dir}}` in the user's
// module and checks that it names this module's directory.
func stormguardDir(t *testing.T, ctx context.Context, gobin, dir, root string) string {
	t.Helper()
	got := strings.TrimSpace(run(t, ctx, dir, goEnv, gobin, "list", "-m", "-f", "{{.Dir}}", "github.com/stormguard/stormguard"))
	if got != root {
		t.Fatalf("go list -m -f {{.Dir}} github.com/stormguard/stormguard = %q, want %q", got, root)
	}
	return got
}

// checkGenerated builds and runs the user's program on the generated code.
func checkGenerated(t *testing.T, ctx context.Context, gobin, dir string) {
	t.Helper()
	gen := filepath.Join(dir, "gen", "shop", "v1", "shop.pb.go")
	if _, err := os.Stat(gen); err != nil {
		t.Fatalf("no generated code: %v", err)
	}
	if got := run(t, ctx, dir, goEnv, gobin, "run", "."); got != wantLookup {
		t.Errorf("idempotency.Lookup in the user's program:\n%s\nwant:\n%s", got, wantLookup)
	}
}

// goEnv keeps the go command in the user's module offline and its go.mod as
// written: every module it needs is one of this module's requirements,
// already in the module cache, and a missing requirement is an error naming
// it rather than a lookup.
var goEnv = []string{"GOFLAGS=-mod=readonly", "GOPROXY=off", "GOWORK=off"}

func command(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String() + errb.String(), err
	}
	return out.String(), nil
}

func run(t *testing.T, ctx context.Context, dir string, env []string, name string, args ...string) string {
	t.Helper()
	out, err := command(ctx, dir, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", filepath.Base(name), strings.Join(args, " "), dir, err, out)
	}
	return out
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mkdirs(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
