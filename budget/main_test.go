package budget_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// base is the tests' zero time; any fixed time will do.
var base = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
