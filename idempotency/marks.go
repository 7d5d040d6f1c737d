package idempotency

import (
	"strings"

	stormguardv1 "github.com/stormguard/stormguard/proto/stormguard/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// Mark is what one entry of ResolverConfig.Idempotent (or the interceptor
// package's WithIdempotent) marks, as far as a protobuf registry can tell.
// See CheckMarks.
type Mark struct {
	// Entry is the entry as given.
	Entry string
	// Service is the entry's service ("pkg.Svc"); "" for an entry that is
	// neither a method nor a service.
	Service string
	// WholeService is true for a whole-service entry ("/pkg.Svc/").
	WholeService bool
	// Checked is true when the registry knows Service, so that the entry
	// could be checked. An entry of a service the registry does not know
	// (its generated package is not linked, or was not generated with
	// google.golang.org/protobuf) marks the names it lists, unchecked.
	Checked bool
	// Unknown is true when the registry knows Service but not the
	// entry's method: the entry marks nothing that exists.
	Unknown bool
	// Marked lists the full methods ("/pkg.Svc/Method") the entry raises
	// to IDEMPOTENT: for a whole service, every method of it whose proto
	// does not already say IDEMPOTENT or NO_SIDE_EFFECTS, writes included.
	Marked []string
	// Closest is, for an Unknown method, the service's method whose name
	// is closest to it ("/pkg.Svc/Range" for "/pkg.Svc/range"): equal but
	// for case, or within an edit distance of a third of its length; ""
	// when none is that close. For an entry whose service the registry
	// knows only under another case ("/pkg.svc/Range"), it is the entry
	// with the service's name as registered.
	Closest string
	// Methods lists, for an Unknown method, every method of the service.
	Methods []string
	// SendOnce lists the methods the entry names whose proto marks them
	// send_once: the entry does not mark them, and they are sent once.
	SendOnce []string
}

// CheckMarks reports, entry by entry, what entries (in the form of
// ResolverConfig.Idempotent) mark in files (nil: protoregistry.GlobalFiles):
// a method name the registry does not know in a service it knows (a
// misspelling, a client library's function name instead of the RPC's, a
// wrong case) marks nothing, and a whole service marks its writes too.
// Empty entries are left out. It reads the registry each time; call it once,
// at start-up.
func CheckMarks(files *protoregistry.Files, entries []string) []Mark {
	if files == nil {
		files = protoregistry.GlobalFiles
	}
	var out []Mark
	for _, e := range entries {
		name := strings.TrimSpace(e)
		if name == "" || name == "/" {
			continue
		}
		if !strings.HasPrefix(name, "/") {
			name = "/" + name
		}
		svc, method, _ := strings.Cut(name[1:], "/")
		m := Mark{Entry: e, Service: svc, WholeService: method == ""}
		if svc == "" || strings.Contains(method, "/") {
			m.Service, m.WholeService = "", false
			out = append(out, m)
			continue
		}
		sd := findService(files, svc)
		if sd == nil {
			// A service the registry knows under another case?
			if other := findServiceFold(files, svc); other != "" {
				m.Closest = "/" + other + "/" + method
			}
			out = append(out, m)
			continue
		}
		m.Checked = true
		methods := sd.Methods()
		if m.WholeService {
			for i := range methods.Len() {
				switch md := methods.Get(i); {
				case sendOnce(md):
					m.SendOnce = append(m.SendOnce, fullName(svc, md))
				case !alreadyRepeatable(md):
					m.Marked = append(m.Marked, fullName(svc, md))
				}
			}
			out = append(out, m)
			continue
		}
		if md := methods.ByName(protoreflect.Name(method)); md != nil {
			switch {
			case sendOnce(md):
				m.SendOnce = []string{fullName(svc, md)}
			case !alreadyRepeatable(md):
				m.Marked = []string{fullName(svc, md)}
			}
			out = append(out, m)
			continue
		}
		m.Unknown = true
		best := -1
		for i := range methods.Len() {
			md := methods.Get(i)
			m.Methods = append(m.Methods, fullName(svc, md))
			n := string(md.Name())
			d := editDistance(strings.ToLower(method), strings.ToLower(n))
			if d <= max(len(method), len(n))/3 && (best < 0 || d < best) {
				best, m.Closest = d, fullName(svc, md)
			}
		}
		out = append(out, m)
	}
	return out
}

func findService(files *protoregistry.Files, svc string) protoreflect.ServiceDescriptor {
	d, err := files.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil
	}
	sd, _ := d.(protoreflect.ServiceDescriptor)
	return sd
}

// findServiceFold returns the full name of a service in files equal to
// svc but for case, or "".
func findServiceFold(files *protoregistry.Files, svc string) string {
	var found string
	files.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		ss := fd.Services()
		for i := range ss.Len() {
			if n := string(ss.Get(i).FullName()); strings.EqualFold(n, svc) {
				found = n
				return false
			}
		}
		return true
	})
	return found
}

func fullName(svc string, md protoreflect.MethodDescriptor) string {
	return "/" + svc + "/" + string(md.Name())
}

// alreadyRepeatable reports whether md's proto already says it may be
// repeated (IDEMPOTENT or NO_SIDE_EFFECTS), so that marking it changes
// nothing.
func alreadyRepeatable(md protoreflect.MethodDescriptor) bool {
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	return ok && opts.GetIdempotencyLevel() != descriptorpb.MethodOptions_IDEMPOTENCY_UNKNOWN
}

// sendOnce reports whether md's proto marks it send_once.
func sendOnce(md protoreflect.MethodDescriptor) bool {
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok || opts == nil {
		return false
	}
	mp, _ := proto.GetExtension(opts, stormguardv1.E_Method).(*stormguardv1.MethodPolicy)
	return mp.GetSendOnce()
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
