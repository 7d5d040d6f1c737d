package idempotency_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/stormguard/stormguard/idempotency"
	_ "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

func TestCheckMarks(t *testing.T) {
	const svc = "/echo.v1.EchoService/"
	all := []string{svc + "Get", svc + "Put", svc + "Charge", svc + "Notify", svc + "Transfer", svc + "List", svc + "Upload", svc + "Chat"}
	got := idempotency.CheckMarks(nil, []string{
		svc + "get",                // the case is wrong
		svc + "Fetch",              // a name the service does not have, close to none
		svc + "Notfy",              // a misspelling
		svc,                        // the whole service
		"echo.v1.EchoService",      // the whole service, another spelling
		svc + "Notify",             // a method the proto leaves unmarked
		svc + "Put",                // already IDEMPOTENT: marking it changes nothing
		svc + "Transfer",           // send_once: never marked
		"/echo.v1.echoservice/Get", // the service's case is wrong
		"/unknown.v1.Svc/Do",       // a service the registry does not know
		"", " ",                    // left out
	})
	want := []idempotency.Mark{
		{Entry: svc + "get", Service: "echo.v1.EchoService", Checked: true, Unknown: true, Closest: svc + "Get", Methods: all},
		{Entry: svc + "Fetch", Service: "echo.v1.EchoService", Checked: true, Unknown: true, Methods: all},
		{Entry: svc + "Notfy", Service: "echo.v1.EchoService", Checked: true, Unknown: true, Closest: svc + "Notify", Methods: all},
		{Entry: svc, Service: "echo.v1.EchoService", WholeService: true, Checked: true, Marked: []string{svc + "Charge", svc + "Notify"}, SendOnce: []string{svc + "Transfer"}},
		{Entry: "echo.v1.EchoService", Service: "echo.v1.EchoService", WholeService: true, Checked: true, Marked: []string{svc + "Charge", svc + "Notify"}, SendOnce: []string{svc + "Transfer"}},
		{Entry: svc + "Notify", Service: "echo.v1.EchoService", Checked: true, Marked: []string{svc + "Notify"}},
		{Entry: svc + "Put", Service: "echo.v1.EchoService", Checked: true},
		{Entry: svc + "Transfer", Service: "echo.v1.EchoService", Checked: true, SendOnce: []string{svc + "Transfer"}},
		{Entry: "/echo.v1.echoservice/Get", Service: "echo.v1.echoservice", Closest: svc + "Get"},
		{Entry: "/unknown.v1.Svc/Do", Service: "unknown.v1.Svc"},
	}
	assert.Equal(t, want, got)
}
