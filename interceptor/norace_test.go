//go:build !race

package interceptor_test

const raceEnabled = false
