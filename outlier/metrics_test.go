package outlier

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"

	"github.com/stormguard/stormguard/internal/origin"
	"github.com/stormguard/stormguard/semconv"
)

// ejectionCounts reads the policy's gRFC A91 counters from r: each
// counter's data points, by attribute set, after checking the scope and
// the unit.
func ejectionCounts(t *testing.T, r *sdkmetric.ManualReader) map[string]map[attribute.Set]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]map[attribute.Set]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			assert.Equal(t, semconv.OutlierScopeName, sm.Scope.Name)
			assert.Equal(t, "{ejection}", m.Unit, m.Name)
			sum, ok := m.Data.(metricdata.Sum[int64])
			require.True(t, ok, "%s is a %T", m.Name, m.Data)
			assert.True(t, sum.IsMonotonic, "%s is a counter", m.Name)
			for _, dp := range sum.DataPoints {
				if out[m.Name] == nil {
					out[m.Name] = map[attribute.Set]int64{}
				}
				out[m.Name][dp.Attributes] += dp.Value
			}
		}
	}
	return out
}

var (
	enforcedAttrs = attribute.NewSet(
		attribute.String("grpc.target", "outliertest:///cluster"),
		attribute.String("grpc.lb.outlier_detection.detection_method", "failure_percentage"),
	)
	overflowAttrs = attribute.NewSet(
		attribute.String("grpc.target", "outliertest:///cluster"),
		attribute.String("grpc.lb.outlier_detection.detection_method", "failure_percentage"),
		attribute.String("grpc.lb.outlier_detection.unenforced_reason", "max_ejection_overflow"),
	)
)

// TestEjectionsAreCountedWithA91Names: one of three round_robin backends
// answers UNAVAILABLE to everything; each time the policy ejects it,
// grpc.lb.outlier_detection.ejections_enforced counts one, with the
// channel's target and the detection method; nothing is left unenforced.
func TestEjectionsAreCountedWithA91Names(t *testing.T) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	c := newMeteredCluster(t, 3, Config{}, mp)
	c.origins[0].SetScript(origin.Always(codes.Unavailable))
	known, _, _ := deadRun(t, c, 0, 3000) // 9 s: ejected, back after 5 s, ejected again
	require.Positive(t, known, "the dead backend was ejected")
	ejections := c.ejections()
	require.GreaterOrEqual(t, ejections[0], 2, "ejected, returned and ejected again")
	assert.Equal(t, map[string]map[attribute.Set]int64{
		semconv.MetricOutlierEjectionsEnforced: {enforcedAttrs: int64(ejections[0])},
	}, ejectionCounts(t, r))
}

// TestUnenforcedOutliersAreCounted: two of three backends are dead, and
// MaxEjectionPercent (50) lets one be ejected: the other stands out from
// the healthy one all the same, and each evaluation that finds it counts
// it in grpc.lb.outlier_detection.ejections_unenforced, reason
// max_ejection_overflow, while the cap stays full.
func TestUnenforcedOutliersAreCounted(t *testing.T) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	c := newMeteredCluster(t, 3, Config{}, mp)
	c.origins[0].SetScript(origin.Always(codes.Unavailable))
	c.origins[1].SetScript(origin.Always(codes.Unavailable))
	c.run(600, step)
	require.Len(t, c.ejected(), 1, "one of three at most")
	got := ejectionCounts(t, r)
	assert.Equal(t, map[attribute.Set]int64{enforcedAttrs: 1}, got[semconv.MetricOutlierEjectionsEnforced])
	unenforced := got[semconv.MetricOutlierEjectionsUnenforced]
	require.Len(t, unenforced, 1)
	first := unenforced[overflowAttrs]
	assert.Positive(t, first, "the dead backend left in was detected")
	// 1 s more, within the ejection's 5 s: the cap stays full, and the
	// evaluations keep finding the other dead backend.
	c.run(330, step)
	require.Len(t, c.ejected(), 1)
	got = ejectionCounts(t, r)
	assert.Equal(t, map[attribute.Set]int64{enforcedAttrs: 1}, got[semconv.MetricOutlierEjectionsEnforced])
	assert.Greater(t, got[semconv.MetricOutlierEjectionsUnenforced][overflowAttrs], first, "counted again at the cap")
}

// TestSetMeterProviderReachesBalancersBuiltAfterIt: the policy as
// registered (no MeterProvider of its own) records with the one
// SetMeterProvider set, and SetMeterProvider(nil) restores the global one.
func TestSetMeterProviderReachesBalancersBuiltAfterIt(t *testing.T) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	SetMeterProvider(mp)
	t.Cleanup(func() { SetMeterProvider(nil) })
	c := newCluster(t, 2, Config{})
	SetMeterProvider(nil)
	other := newCluster(t, 2, Config{}) // records with the global provider
	c.origins[0].SetScript(origin.Always(codes.Unavailable))
	other.origins[0].SetScript(origin.Always(codes.Unavailable))
	known, _, _ := deadRun(t, c, 0, 300)
	require.Positive(t, known)
	known, _, _ = deadRun(t, other, 0, 300)
	require.Positive(t, known)
	assert.Equal(t, map[string]map[attribute.Set]int64{
		semconv.MetricOutlierEjectionsEnforced: {enforcedAttrs: 1},
	}, ejectionCounts(t, r), "the first cluster's one ejection, not the second's")
}
