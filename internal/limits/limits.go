// Package limits holds bounds that several stormguard packages apply, so
// that they agree.
package limits

// MaxAttempts caps the attempts of one logical call, the first included,
// whatever a proto option or a client option asks for. grpc-go caps its
// retry policy at 5; a hedged call may reasonably want a few more.
const MaxAttempts = 10
