package outlier

import (
	"context"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	otelconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/stormguard/stormguard/semconv"
)

// providerBox holds the MeterProvider SetMeterProvider set.
type providerBox struct{ mp metric.MeterProvider }

var meterProvider atomic.Pointer[providerBox]

// SetMeterProvider sets the OpenTelemetry MeterProvider the policy records
// its metrics with, gRFC A91's counters (see docs/metrics.md):
//
//   - grpc.lb.outlier_detection.ejections_enforced: endpoints ejected;
//   - grpc.lb.outlier_detection.ejections_unenforced: outliers detected
//     but not ejected, with grpc.lb.outlier_detection.unenforced_reason
//     max_ejection_overflow (as many endpoints as MaxEjectionPercent
//     allows were ejected already, or it is the last connected endpoint),
//     counted at each evaluation that finds them (every Interval, and when
//     an endpoint's failures call for one).
//
// Both carry grpc.target (the ClientConn's target, as gRPC spells it) and
// grpc.lb.outlier_detection.detection_method, failure_percentage. They are
// recorded by the balancers built after the call: set it before creating
// the ClientConns (a ClientConn builds its balancer when it first
// resolves). nil restores the default, otel.GetMeterProvider(). The
// instrumentation scope is the package's import path. It is safe for
// concurrent use.
func SetMeterProvider(mp metric.MeterProvider) {
	if mp == nil {
		meterProvider.Store(nil)
		return
	}
	meterProvider.Store(&providerBox{mp})
}

// metrics are one balancer's instruments, and the options it records
// with, made when it is built.
type metrics struct {
	enforced, unenforced         metric.Int64Counter
	enforcedOpts, unenforcedOpts []metric.AddOption
}

// newMetrics makes a balancer's metrics on mp (nil: SetMeterProvider's,
// else the global one), for the ClientConn of target.
func newMetrics(mp metric.MeterProvider, target string) *metrics {
	if mp == nil {
		if b := meterProvider.Load(); b != nil {
			mp = b.mp
		} else {
			mp = otel.GetMeterProvider()
		}
	}
	m := mp.Meter(semconv.OutlierScopeName, metric.WithSchemaURL(otelconv.SchemaURL))
	met := &metrics{}
	var err error
	met.enforced, err = m.Int64Counter(semconv.MetricOutlierEjectionsEnforced, metric.WithUnit("{ejection}"),
		metric.WithDescription("Endpoints the outlier policy ejected, by detection method (gRFC A91)."))
	handle(err)
	met.unenforced, err = m.Int64Counter(semconv.MetricOutlierEjectionsUnenforced, metric.WithUnit("{ejection}"),
		metric.WithDescription("Outliers the policy detected but did not eject, by detection method and reason, at each evaluation that found them (gRFC A91)."))
	handle(err)
	base := []attribute.KeyValue{
		semconv.AttrGRPCTarget.String(target),
		semconv.AttrOutlierDetectionMethod.String(semconv.OutlierFailurePercentage),
	}
	met.enforcedOpts = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(base...))}
	met.unenforcedOpts = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(
		append(base, semconv.AttrOutlierUnenforcedReason.String(semconv.OutlierMaxEjectionOverflow))...))}
	return met
}

// record counts an evaluation's ejections and the outliers it left in. A
// nil m (a balancer made without Build, in tests) records nothing.
func (m *metrics) record(ejected, overflow int) {
	if m == nil {
		return
	}
	ctx := context.Background()
	if ejected > 0 {
		m.enforced.Add(ctx, int64(ejected), m.enforcedOpts...)
	}
	if overflow > 0 {
		m.unenforced.Add(ctx, int64(overflow), m.unenforcedOpts...)
	}
}

// countsOverflow reports whether outliers that cannot be ejected are
// counted: only then need an evaluation at the cap look for them.
func (m *metrics) countsOverflow() bool {
	return m != nil && m.unenforced.Enabled(context.Background())
}

// handle passes an instrument's creation error to OpenTelemetry's error
// handler; the instrument returned is then a working no-op.
func handle(err error) {
	if err != nil {
		otel.Handle(err)
	}
}
