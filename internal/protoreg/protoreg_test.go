package protoreg_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
	"github.com/stormguard/stormguard/internal/protoreg"
)

func TestResponseType(t *testing.T) {
	mt := protoreg.ResponseType(echov1.EchoService_List_FullMethodName)
	require.NotNil(t, mt)
	assert.Equal(t, "echo.v1.ListResponse", string(mt.Descriptor().FullName()))
	in := protoreg.RequestType(echov1.EchoService_List_FullMethodName)
	require.NotNil(t, in)
	assert.Equal(t, "echo.v1.ListRequest", string(in.Descriptor().FullName()))
	for _, bad := range []string{"", "x", "/no.Svc/M", "/echo.v1.EchoService/Nope", "/echo.v1.GetRequest/Get"} {
		assert.Nil(t, protoreg.ResponseType(bad), bad)
		assert.Nil(t, protoreg.RequestType(bad), bad)
	}
}

func TestSplitMethod(t *testing.T) {
	svc, m, ok := protoreg.SplitMethod("/pkg.Svc/Do")
	assert.True(t, ok)
	assert.Equal(t, "pkg.Svc", svc)
	assert.Equal(t, "Do", m)
	for _, bad := range []string{"", "x", "/a", "/a/", "//b", "/a/b/c", "a/b", "/ab"} {
		_, _, ok := protoreg.SplitMethod(bad)
		assert.False(t, ok, bad)
	}
}

func TestMethodSet(t *testing.T) {
	s := protoreg.ParseMethodSet([]string{" pkg.A ", "/pkg.B/", "/pkg.C", "pkg.D/Do", "/pkg.E/Do", "", " ", "/"})
	assert.False(t, s.Empty())
	for _, in := range []string{"/pkg.A/X", "/pkg.B/X", "/pkg.C/X", "/pkg.D/Do", "/pkg.E/Do"} {
		assert.True(t, s.Has(in), in)
	}
	for _, out := range []string{"/pkg.D/Other", "/pkg.F/Do", "", "pkg.A", "/pkg.A"} {
		assert.False(t, s.Has(out), out)
	}
	assert.True(t, protoreg.ParseMethodSet([]string{"", " ", "/"}).Empty())
	assert.True(t, protoreg.MethodSet{}.Empty())
	assert.False(t, protoreg.MethodSet{}.Has("/pkg.A/X"))
}

// FuzzMethodSet parses entries of any shape: never a panic, and a listed
// full method or service always matches.
func FuzzMethodSet(f *testing.F) {
	for _, s := range [][2]string{{"pkg.Svc", "/pkg.Svc/Do"}, {"/pkg.Svc/Do", "/pkg.Svc/Do"}, {"", ""}, {"/", "//"},
		{"a/b/c", "/a/b/c"}, {" x.Y ", "/x.Y/Z"}, {"\x00/\xff", "/\x00/\xff"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, entry, method string) {
		s := protoreg.ParseMethodSet([]string{entry})
		_ = s.Has(method)
		_ = s.Empty()
		if svc, m, ok := protoreg.SplitMethod(method); ok && !strings.ContainsAny(svc+m, " \t\r\n\v\f\u0085\u00a0") {
			if !protoreg.ParseMethodSet([]string{method}).Has(method) {
				t.Fatalf("the set of %q does not have it", method)
			}
			if !protoreg.ParseMethodSet([]string{svc}).Has(method) {
				t.Fatalf("the set of service %q does not have %q", svc, method)
			}
		}
	})
}
