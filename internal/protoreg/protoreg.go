// Package protoreg finds what stormguard needs to know about a gRPC
// method by its full name ("/pkg.Service/Method"): its parts, its
// descriptor and its message types in the protobuf registries, and
// whether it belongs to a configured set of methods.
package protoreg

import (
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// SplitMethod splits "/pkg.Svc/Method" into its two parts. ok is false
// for a malformed name: no leading slash, an empty part, or more than two
// parts.
func SplitMethod(full string) (svc, method string, ok bool) {
	if len(full) < 4 || full[0] != '/' {
		return "", "", false
	}
	svc, method, ok = strings.Cut(full[1:], "/")
	if !ok || svc == "" || method == "" || strings.IndexByte(method, '/') >= 0 {
		return "", "", false
	}
	return svc, method, true
}

// FindMethod returns the descriptor of svc's method in files, or nil.
func FindMethod(files *protoregistry.Files, svc, method string) protoreflect.MethodDescriptor {
	d, err := files.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	return sd.Methods().ByName(protoreflect.Name(method))
}

// ResponseType returns the Go type of fullMethod's response message, from
// protoregistry.GlobalFiles and GlobalTypes, or nil for an unknown method
// or a malformed name. It is not cached: callers resolve it once per
// method.
func ResponseType(fullMethod string) protoreflect.MessageType { return messageType(fullMethod, true) }

// RequestType is ResponseType for the request message.
func RequestType(fullMethod string) protoreflect.MessageType { return messageType(fullMethod, false) }

func messageType(fullMethod string, output bool) protoreflect.MessageType {
	svc, method, ok := SplitMethod(fullMethod)
	if !ok {
		return nil
	}
	md := FindMethod(protoregistry.GlobalFiles, svc, method)
	if md == nil {
		return nil
	}
	d := md.Input()
	if output {
		d = md.Output()
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName())
	if err != nil {
		return nil
	}
	return mt
}

// MethodSet is a set of full methods and whole services. The zero
// MethodSet is empty.
type MethodSet struct {
	services map[string]bool // "pkg.Svc"
	methods  map[string]bool // "/pkg.Svc/Method"
}

// ParseMethodSet parses entries that are full methods ("/pkg.Svc/Method",
// the leading slash optional) or whole services ("/pkg.Svc/", "/pkg.Svc"
// or "pkg.Svc"). Surrounding spaces and empty entries are ignored.
func ParseMethodSet(entries []string) MethodSet {
	s := MethodSet{services: map[string]bool{}, methods: map[string]bool{}}
	for _, o := range entries {
		o = strings.TrimSpace(o)
		if o == "" {
			continue
		}
		if !strings.HasPrefix(o, "/") {
			o = "/" + o
		}
		svc, method, ok := strings.Cut(o[1:], "/")
		switch {
		case !ok || method == "": // "/pkg.Svc" or "/pkg.Svc/"
			if svc != "" {
				s.services[svc] = true
			}
		default:
			s.methods[o] = true
		}
	}
	return s
}

// Empty reports whether s holds no method and no service.
func (s MethodSet) Empty() bool { return len(s.services)+len(s.methods) == 0 }

// Has reports whether fullMethod ("/pkg.Svc/Method") is in s, by name or
// by service. A malformed name is in s only if it is listed as it is.
func (s MethodSet) Has(fullMethod string) bool {
	if s.methods[fullMethod] {
		return true
	}
	svc, _, ok := SplitMethod(fullMethod)
	return ok && s.services[svc]
}
