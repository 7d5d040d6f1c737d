package interceptor

import (
	"time"

	"github.com/stormguard/stormguard/internal/clock"
)

func init() {
	clock.ClientOption = func(now func() time.Time, newTimer func(time.Duration) clock.Timer) any {
		return clientOptionFunc(func(o *clientOptions) { o.now, o.newTimer = now, newTimer })
	}
}
