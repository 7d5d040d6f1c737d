package interceptor_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stormguard/stormguard/interceptor"
	"github.com/stormguard/stormguard/internal/origin"
	echov1 "github.com/stormguard/stormguard/internal/proto/echo/v1"
)

// The Client lists its targets with budget balance and breaker state, and
// serves them as JSON.
func TestTargetsAndStateHandler(t *testing.T) {
	e := newEnv(t, origin.Succeed())
	_, err := e.echo.Put(t.Context(), &echov1.PutRequest{})
	require.NoError(t, err)
	ts := e.guard.Targets()
	require.Len(t, ts, 1)
	assert.Equal(t, e.server.Listener.Target, ts[0].Target)
	require.NotNil(t, ts[0].Budget)
	assert.Equal(t, uint64(1), ts[0].Budget.Requests)
	require.Len(t, ts[0].Breakers, 1, "one breaker per method called")
	assert.Equal(t, put, ts[0].Breakers[0].Method)
	assert.Equal(t, "closed", ts[0].Breakers[0].State)
	require.Len(t, ts[0].Endpoints, 1)
	assert.Equal(t, int64(1), ts[0].Endpoints[0].OK)

	rec := httptest.NewRecorder()
	e.guard.StateHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/stormguard", nil))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	var body struct {
		Targets []interceptor.TargetState `json:"targets"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body))
	assert.Equal(t, ts[0].Target, body.Targets[0].Target)
	rec = httptest.NewRecorder()
	e.guard.StateHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/debug/stormguard", nil))
	assert.Equal(t, http.StatusMethodNotAllowed, rec.Code)
}
