package idempotency_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/durationpb"

	stormguardv1 "github.com/stormguard/stormguard/proto/stormguard/v1"
)

// policyTestFiles builds, at run time, a registry with one file whose
// methods set every MethodPolicy field, the way protoc would encode them.
func policyTestFiles(t *testing.T) *protoregistry.Files {
	t.Helper()
	tuned := &descriptorpb.MethodOptions{IdempotencyLevel: descriptorpb.MethodOptions_IDEMPOTENT.Enum()}
	proto.SetExtension(tuned, stormguardv1.E_Method, &stormguardv1.MethodPolicy{
		MaxAttempts:       4,
		HedgingDelay:      durationpb.New(20e6),
		MaxHedges:         2,
		RetryableCodes:    []string{"UNAVAILABLE", "RESOURCE_EXHAUSTED", "NOT_A_CODE"},
		PerAttemptTimeout: durationpb.New(250e6),
	})
	capped := &descriptorpb.MethodOptions{}
	proto.SetExtension(capped, stormguardv1.E_Method, &stormguardv1.MethodPolicy{RetryWithKey: true, MaxAttempts: 1000})
	// Round-trip through bytes, as a generated file would carry them.
	reencode := func(o *descriptorpb.MethodOptions) *descriptorpb.MethodOptions {
		b, err := proto.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		out := &descriptorpb.MethodOptions{}
		if err := (proto.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(b, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	fd := &descriptorpb.FileDescriptorProto{
		Name:    proto.String("test/v1/tuned.proto"),
		Package: proto.String("test.v1"),
		Syntax:  proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{
			{Name: proto.String("Req")}, {Name: proto.String("Resp")},
		},
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("TunedService"),
			Method: []*descriptorpb.MethodDescriptorProto{
				{Name: proto.String("Tuned"), InputType: proto.String(".test.v1.Req"), OutputType: proto.String(".test.v1.Resp"), Options: reencode(tuned)},
				{Name: proto.String("Capped"), InputType: proto.String(".test.v1.Req"), OutputType: proto.String(".test.v1.Resp"), Options: reencode(capped)},
			},
		}},
	}
	f, err := protodesc.NewFile(fd, protoregistry.GlobalFiles)
	if err != nil {
		t.Fatal(err)
	}
	files := new(protoregistry.Files)
	if err := files.RegisterFile(f); err != nil {
		t.Fatal(err)
	}
	return files
}
