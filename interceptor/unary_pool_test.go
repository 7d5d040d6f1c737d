package interceptor

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// A pooled unary state, once its call is over, holds no reference to
// what the call was given or made (its context, request, reply, options,
// errors, the Client): a state in the pool must not keep any of them
// alive. Only the state's own call options, which point into the state,
// stay.
func TestUnaryStateClearDropsEveryReference(t *testing.T) {
	cc, err := grpc.NewClient("passthrough:///pool", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := NewClient(WithRetryPolicy(RetryPolicy{BackoffBase: time.Microsecond, BackoffMax: time.Microsecond}))
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "k", "v"), time.Hour)
	defer cancel()
	var tr metadata.MD
	tries := 0
	invoker := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		if tries++; tries < 3 {
			return status.Error(codes.Unavailable, "down")
		}
		return nil
	}
	st := unaryPool.New().(*unaryState)
	err = st.call(c, ctx, echov1.EchoService_Charge_FullMethodName, &echov1.ChargeRequest{RequestId: "r"}, &echov1.ChargeResponse{},
		cc, invoker, []grpc.CallOption{grpc.Trailer(&tr), idempotency.CallKey("0123456789abcdef0123456789abcdef")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st.clear()
	// The state's own options point into it.
	self := map[string]bool{"unaryState.own": true}
	var held []string
	heldRefs(reflect.ValueOf(st).Elem(), "unaryState", self, &held)
	if len(held) > 0 {
		t.Errorf("a cleared state still holds:\n%s", strings.Join(held, "\n"))
	}
}

// heldRefs appends to held the paths of the references v holds: non-nil
// pointers, interfaces, maps, funcs and channels, slices' elements up to
// their capacity, maps' entries, and non-empty strings; self are the paths
// allowed.
func heldRefs(v reflect.Value, path string, self map[string]bool, held *[]string) {
	if self[path] {
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		switch pkg := v.Type().PkgPath(); {
		case strings.HasPrefix(pkg, "sync"), v.Type() == reflect.TypeFor[time.Time]():
			return // atomics and locks hold no reference; a Time's location is a global
		}
		for i := range v.NumField() {
			heldRefs(v.Field(i), path+"."+v.Type().Field(i).Name, self, held)
		}
	case reflect.Array:
		for i := range v.Len() {
			heldRefs(v.Index(i), path, self, held)
		}
	case reflect.Slice:
		full := v.Slice3(0, v.Cap(), v.Cap())
		for i := range full.Len() {
			heldRefs(full.Index(i), path+"[]", self, held)
		}
	case reflect.Map:
		if v.Len() > 0 { // an empty map may be kept, to be filled again
			*held = append(*held, path)
		}
	case reflect.Pointer, reflect.Interface, reflect.Func, reflect.Chan:
		if !v.IsNil() {
			*held = append(*held, path)
		}
	case reflect.String:
		if v.Len() > 0 {
			*held = append(*held, path)
		}
	}
}
