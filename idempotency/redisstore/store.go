package redisstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/dedupe"
)

// Store is a [dedupe.Store] on Redis: every replica of a service that
// uses a Store with the same Redis and Prefix sees the same keys. It has
// the semantics of dedupe.MemoryStore (bounds in total and per identity,
// eviction by age never younger than the retry horizon, tombstones for
// records that do not fit, a TTL), plus leases, so that a claim whose
// owner died ends, and a fence after Redis lost its data.
//
// Create one with [New] and stop it with [Store.Close]; the zero Store is
// not usable. A Store is safe for concurrent use.
type Store struct {
	rdb                         redis.UniversalClient
	prefix, gKey, channel       string
	maxEntries, maxPerID        int
	maxBytes, maxBytesPerID     int64
	ttl, horizon, lease, margin time.Duration
	fence, heartbeat, poll, op  time.Duration
	now                         func() time.Time // this replica's clock: deadlines, local bookkeeping
	redisNow                    func() time.Time // replaces Redis's TIME in tests; nil: TIME
	br                          *breaker.Breaker

	tokPrefix string
	tokSeq    atomic.Uint64

	lost    atomic.Uint64          // outcomes Complete gave up recording
	owned   sync.Map               // token -> *ownedClaim: this process's claims in flight
	nOwned  atomic.Int64           // entries of owned
	orphans sync.Map               // token -> *token: claims whose reply was lost; Redis may hold them
	epoch   atomic.Pointer[string] // the last epoch Redis answered with

	mu      sync.Mutex
	waiters map[string][]chan struct{}

	kick      chan struct{}
	stop      chan struct{}
	ps        *redis.PubSub
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// ownedClaim is a claim this process holds in flight. Claim sets its
// fields before storing it in Store.owned; then only the heartbeat
// goroutine reads and writes epoch.
type ownedClaim struct {
	t     *token
	scope dedupe.Scope
	fp    dedupe.Fingerprint
	epoch string // the epoch Redis last held it in
}

// token is a Claim's Token.
type token struct {
	store    *Store
	tok      string    // the execution's token in Redis
	epoch    string    // the epoch the claim was made in
	key      string    // the entry's Redis key
	leaseEnd int64     // ms on Redis's clock; owned claims only
	until    time.Time // the lease's end on this replica's clock, at the earliest; owned and orphaned claims
	size     int64     // the entry's size; owned claims only
}

// New returns a Store on c.Client configured by c. It does not talk to
// Redis: a Store works as soon as Redis does.
func New(c Config) (*Store, error) {
	if c.Client == nil {
		return nil, errors.New("redisstore: Config.Client is nil")
	}
	if err := checkClient(c.Client); err != nil {
		return nil, err
	}
	c = c.withDefaults()
	s := &Store{
		rdb:    c.Client,
		prefix: c.Prefix, gKey: c.Prefix + "g", channel: c.Prefix + "done",
		maxEntries: c.MaxEntries, maxPerID: c.MaxEntriesPerIdentity,
		maxBytes: c.MaxBytes, maxBytesPerID: c.MaxBytesPerIdentity,
		ttl: c.TTL, horizon: c.RetryHorizon, lease: c.Lease, margin: c.LeaseMargin,
		fence: c.Fence, heartbeat: c.Heartbeat, poll: c.PollInterval, op: c.OpTimeout,
		now:       c.now,
		redisNow:  c.redisNow,
		br:        breaker.NewRegistry(c.Breaker).For("redisstore:" + c.Prefix),
		tokPrefix: newTokenPrefix(),
		waiters:   map[string][]chan struct{}{},
		kick:      make(chan struct{}, 1),
		stop:      make(chan struct{}),
	}
	s.start()
	return s, nil
}

// newTokenPrefix returns a random prefix for the tokens of one Store, so
// that no two Stores make the same token.
func newTokenPrefix() string {
	var r [8]byte
	_, _ = rand.Read(r[:])
	return hex.EncodeToString(r[:]) + "."
}

// start subscribes to the store's notifications and starts the goroutines
// that wake waiters on them and watch claims in flight; Close stops both.
func (s *Store) start() {
	s.ps = s.rdb.Subscribe(context.Background(), s.channel)
	msgs := s.ps.Channel()
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		for m := range msgs {
			s.wake(m.Payload)
		}
	}()
	go func() {
		defer s.wg.Done()
		s.watch()
	}()
}

// checkClient refuses a client whose commands ignore their context's
// deadline.
func checkClient(c redis.UniversalClient) error {
	var ok bool
	switch c := c.(type) {
	case *redis.Client:
		ok = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		ok = c.Options().ContextTimeoutEnabled
	default:
		return nil
	}
	if !ok {
		return errors.New("redisstore: the Redis client must have ContextTimeoutEnabled set, " +
			"so that OpTimeout and each caller's deadline bound its commands")
	}
	return nil
}

// Close stops the Store's background work (its notification subscription
// and its heartbeat) and wakes nobody: waiters still poll until their
// contexts end. It does not close Config.Client. Close is idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		close(s.stop)
		err = s.ps.Close()
		s.wg.Wait()
	})
	return err
}

// Sizes the store counts against MaxBytes, as Redis 7.0 holds them
// (measured with INFO memory, and checked by TestMemoryBoundedUnderAFlood
// within 25%): fixed costs per entry and per identity (the entry's hash
// and its fields, its members in the sorted sets and the token hash, their
// dictionary entries), plus the strings each holds. An entry's hash is a
// compact listpack while each of its values is at most 64 bytes
// (hash-max-listpack-value); a longer record or method name turns it into
// a hash table, which costs about 440 bytes more.
const (
	entryBase     = 640
	identityBase  = 250
	identityByte  = 3 // the identity's name is held three times
	listpackValue = 64
	hashTable     = 440
)

// entryCost returns what an entry of scope for method costs in flight: a
// tombstone's worth.
func entryCost(scope dedupe.Scope, method string) int64 {
	n := entryBase + 2*(len(scope.Identity)+len(scope.Key)) + len(method) + sha256.Size
	if len(method) > listpackValue {
		n += hashTable
	}
	return int64(n)
}

// recordCost returns what a record encoded in n bytes adds to its entry.
func recordCost(n int, method string) int64 {
	if n > listpackValue && len(method) <= listpackValue {
		n += hashTable
	}
	return int64(n)
}

// header returns the arguments every script starts with. The scripts
// read the time from Redis (TIME), so that every replica's operations are
// measured on one clock, whatever the replicas' own clocks say; only a
// test's clock (Config.redisNow) is passed in.
func (s *Store) header(tok string, extra int) []any {
	a := make([]any, headerLen, headerLen+extra)
	a[argPrefix] = s.prefix
	a[argNow] = ""
	if s.redisNow != nil {
		a[argNow] = s.redisNow().UnixMilli()
	}
	a[argNewEpoch] = tok
	a[argFence] = s.fence.Milliseconds()
	a[argIDBase] = identityBase
	a[argIDPerByte] = identityByte
	a[argTTL] = s.ttl.Milliseconds()
	a[argHorizon] = s.horizon.Milliseconds()
	a[argMaxEntries] = s.maxEntries
	a[argMaxPerID] = s.maxPerID
	a[argMaxBytes] = s.maxBytes
	a[argMaxBytesPerID] = s.maxBytesPerID
	a[argGrace] = max(s.margin, time.Minute).Milliseconds()
	a[argBusy] = busyPushback.Milliseconds()
	return a
}

// busyPushback is when to come back after a refusal while only entries in
// flight hold the room, as dedupe.MemoryStore says.
const busyPushback = time.Second

func (s *Store) newToken() string {
	return s.tokPrefix + strconv.FormatUint(s.tokSeq.Add(1), 36)
}

// entryKey returns the Redis key of scope's entry. The identity's length
// comes first, so that no two scopes share a key.
func (s *Store) entryKey(scope dedupe.Scope) string {
	var b strings.Builder
	b.Grow(len(s.prefix) + 8 + len(scope.Identity) + len(scope.Key))
	b.WriteString(s.prefix)
	b.WriteString("e:")
	b.WriteString(strconv.Itoa(len(scope.Identity)))
	b.WriteByte(':')
	b.WriteString(scope.Identity)
	b.WriteString(scope.Key)
	return b.String()
}

// run runs script on the entry key ek with args, bounded by OpTimeout and
// ctx, and reports the outcome on tk (nil: not gated by the breaker). A
// failure is a status error: codes.ResourceExhausted when Redis is out of
// memory, the caller's context's status when it ended, codes.Unavailable
// otherwise.
func (s *Store) run(ctx context.Context, tk *breaker.Ticket, op string, script *redis.Script, ek string, args []any) ([]any, error) {
	octx, cancel := context.WithTimeout(ctx, s.op)
	v, err := script.Run(octx, s.rdb, []string{s.gKey, ek}, args...).Slice()
	cancel()
	if err == nil && len(v) >= 2 {
		if tk != nil {
			tk.Done(false)
		}
		if e, ok := v[1].(string); ok {
			s.observe(e)
		}
		return v, nil
	}
	if err == nil {
		err = errors.New("unexpected reply")
	}
	switch {
	case ctx.Err() != nil:
		if tk != nil {
			tk.Ignore()
		}
		return nil, status.FromContextError(ctx.Err()).Err()
	case strings.HasPrefix(err.Error(), "OOM "):
		if tk != nil {
			tk.Done(false) // Redis answered
		}
		return nil, exhausted("redisstore: Redis is out of memory (maxmemory); the request did not run", busyPushback)
	}
	if tk != nil {
		tk.Done(true)
	}
	return nil, status.Error(codes.Unavailable, "redisstore: "+op+": "+err.Error())
}

// admit asks the breaker for a Redis round trip.
func (s *Store) admit() (breaker.Ticket, error) {
	t, err := s.br.Admit()
	if err != nil {
		return t, status.Error(codes.Unavailable, "redisstore: Redis failed every recent operation; "+
			"the circuit is open for "+s.br.RetryAfter().Round(time.Millisecond).String())
	}
	return t, nil
}

// exhausted returns a ResourceExhausted status error with a RetryInfo of
// wait.
func exhausted(msg string, wait time.Duration) error {
	st, err := status.New(codes.ResourceExhausted, msg).WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
	if err != nil {
		return status.Error(codes.ResourceExhausted, msg)
	}
	return st.Err()
}

// Claim implements [dedupe.Store]. The claim is held until ctx's deadline
// plus LeaseMargin, or for Lease without a deadline. It fails with
// codes.ResourceExhausted as dedupe.MemoryStore does, and with
// codes.Unavailable when Redis does not answer, when the breaker is open,
// and during the fence after Redis lost its data.
func (s *Store) Claim(ctx context.Context, scope dedupe.Scope, fp dedupe.Fingerprint) (dedupe.Claim, error) {
	if len(scope.Identity) > dedupe.MaxIdentityLen || len(scope.Key) > idempotency.MaxKeyLen {
		return dedupe.Claim{}, status.Error(codes.InvalidArgument, "redisstore: identity or key too long")
	}
	tk, err := s.admit()
	if err != nil {
		return dedupe.Claim{}, err
	}
	leaseMs, until := s.leaseOf(ctx)
	tok := s.newToken()
	ek := s.entryKey(scope)
	size := entryCost(scope, fp.Method)
	args := append(s.header(tok, 7), scope.Identity, scope.Key, fp.Method, fp.RequestHash[:], tok, leaseMs, size)
	v, err := s.run(ctx, &tk, "claim", claimScript, ek, args)
	if err != nil {
		if status.Code(err) != codes.ResourceExhausted { // not refused for want of memory: it may have been applied
			s.orphans.Store(tok, &token{store: s, tok: tok, key: ek, until: until})
		}
		return dedupe.Claim{}, err
	}
	epoch, _ := v[1].(string)
	c := dedupe.Claim{Scope: scope}
	switch v[0] {
	case "O":
		if len(v) < 3 {
			break
		}
		leaseEnd, ok := v[2].(int64)
		if !ok {
			break
		}
		t := &token{store: s, tok: tok, epoch: epoch, key: ek, leaseEnd: leaseEnd, until: until, size: size}
		s.owned.Store(tok, &ownedClaim{t: t, scope: scope, fp: fp, epoch: epoch})
		s.nOwned.Add(1)
		c.State, c.Holder, c.Token = dedupe.Owned, fp, t
		return c, nil
	case "F":
		if len(v) < 5 {
			break
		}
		holder, ok := fingerprint(v[3], v[4])
		if !ok {
			break
		}
		other, _ := v[2].(string)
		c.State, c.Holder, c.Token = dedupe.InFlight, holder, &token{store: s, tok: other, epoch: epoch, key: ek}
		return c, nil
	case "D":
		if len(v) < 7 {
			break
		}
		holder, ok := fingerprint(v[3], v[4])
		if !ok {
			break
		}
		rec, err := record(v[5], v[6], holder)
		if err != nil {
			return dedupe.Claim{}, err
		}
		c.State, c.Holder, c.Record = dedupe.Done, holder, rec
		return c, nil
	case "X":
		wait := msArg(v, 2)
		return dedupe.Claim{}, status.Error(codes.Unavailable, "redisstore: Redis lost the store's data (a restart without "+
			"persistence, a failover, a flush) or this is its first use: new claims wait "+wait.String()+
			" for the owners of lost claims to take them back; the request did not run")
	case "R":
		wait := msArg(v, 2)
		why := "the store is full"
		if len(v) > 3 && v[3] == "q" {
			why = "this caller holds its share of the store"
		}
		return dedupe.Claim{}, exhausted("dedupe: "+why+" in requests in flight and records younger than the retry horizon; "+
			"the request did not run; try again in "+wait.Round(time.Millisecond).String(), wait)
	}
	return dedupe.Claim{}, status.Errorf(codes.Unavailable, "redisstore: claim: unexpected reply %v", v)
}

// leaseOf returns the lease of a claim made now with ctx, in
// milliseconds (at least 1): the time left before ctx's deadline plus
// LeaseMargin, or Lease without a deadline. The lease is sent as a
// duration, and Redis ends it on its own clock; the time left is measured
// on this replica's clock, the one the deadline was set with. until is the
// lease's end on this replica's clock, at the earliest: Redis starts it
// once the claim arrives.
func (s *Store) leaseOf(ctx context.Context) (ms int64, until time.Time) {
	now := s.now()
	lease := s.lease
	if dl, ok := ctx.Deadline(); ok {
		lease = dl.Sub(now) + s.margin
	}
	ms = max(lease.Milliseconds(), 1)
	return ms, now.Add(time.Duration(ms) * time.Millisecond)
}

// msArg returns v[i] as a duration in milliseconds, at least 1 ms.
func msArg(v []any, i int) time.Duration {
	if i < len(v) {
		if n, ok := v[i].(int64); ok && n > 0 {
			return time.Duration(n) * time.Millisecond
		}
	}
	return time.Millisecond
}

// fingerprint rebuilds a Fingerprint from its stored method and hash.
func fingerprint(method, hash any) (dedupe.Fingerprint, bool) {
	m, ok1 := method.(string)
	h, ok2 := hash.(string)
	var fp dedupe.Fingerprint
	if !ok1 || !ok2 || m == "" || len(h) != sha256.Size {
		return fp, false
	}
	fp.Method = m
	copy(fp.RequestHash[:], h)
	return fp, true
}

// tooLarge is the message of a tombstone's replay, as dedupe.MemoryStore's.
const tooLarge = "dedupe: this request was executed, but its response was too large to keep for replay; it is not executed again"

// record decodes a stored record (or tombstone) of fp.
func record(data, tomb any, fp dedupe.Fingerprint) (*dedupe.Record, error) {
	if t, _ := tomb.(string); t != "" {
		return &dedupe.Record{Fingerprint: fp, Code: codes.Internal, Message: tooLarge}, nil
	}
	b, _ := data.(string)
	rec, err := decodeRecord([]byte(b), fp)
	if err != nil {
		return nil, status.Error(codes.Unavailable, "redisstore: "+err.Error())
	}
	return rec, nil
}

// ownedToken returns the token of the owned claim c of this store.
func (s *Store) ownedToken(c dedupe.Claim) (*token, error) {
	t, ok := c.Token.(*token)
	if !ok || t == nil || t.store != s || c.State != dedupe.Owned {
		return nil, status.Error(codes.Internal, "redisstore: not an owned claim of this store")
	}
	return t, nil
}

// releaseAttempts is how many times Release tries. A release lost to
// failed round trips costs no second execution (the handler's outcome was
// not to be stored): the scope is held for nobody until its lease ends.
const releaseAttempts = 3

// Complete's backoff between tries: it starts at completeBackoff and
// doubles up to maxCompleteBackoff, so that once Redis answers again the
// outcome is recorded within about half a second.
const (
	completeBackoff    = 20 * time.Millisecond
	maxCompleteBackoff = 500 * time.Millisecond
)

// Complete implements [dedupe.Store]. A record that does not fit is kept
// as a tombstone. Complete is not refused by the breaker.
//
// The handler ran: if its outcome were not recorded, a retry would run it
// again once the claim's lease ended. So while Redis does not answer (each
// try bounded by OpTimeout), Complete keeps trying, with backoff, for as
// long as the lease lasts, as this replica measures it from before the
// claim was sent (Redis ends it no earlier). Meanwhile the request's
// duplicates find it in flight and wait, or, while Redis does not answer
// them either, are refused with codes.Unavailable and a pushback; the
// caller of this execution gets its response once the outcome is recorded.
// Once the lease has ended (or the Store is closed), Complete gives up
// with codes.Unavailable, saying that the outcome is lost, and counts it
// in Stats.LostOutcomes. A Complete whose call Redis ran more than once
// (a reply lost, then a retry) succeeds: every try carries one nonce.
func (s *Store) Complete(ctx context.Context, c dedupe.Claim, rec *dedupe.Record) error {
	if rec == nil {
		return status.Error(codes.Internal, "redisstore: Complete with a nil record")
	}
	t, err := s.ownedToken(c)
	if err != nil {
		return err
	}
	if rec.Fingerprint != c.Holder {
		return status.Error(codes.Internal, "redisstore: Complete with a record for another request")
	}
	defer s.forget(t.tok)
	data, err := encodeRecord(nil, rec)
	size := recordCost(len(data), c.Holder.Method)
	switch {
	case err != nil:
		// The schema gives the encoder no reason to fail. Were it to, the
		// request still ran: it is kept as a tombstone, like a record too
		// large to keep (the script keeps a tombstone for a size over the
		// bound).
		data, size = nil, math.MaxInt64
	case t.size+size > s.maxBytesPerID:
		data = nil // a tombstone: do not send what cannot be kept
	}
	nonce := s.newToken() // the same for every try: see completeScript
	backoff := completeBackoff
	for tries := 1; ; tries++ {
		v, err := s.completeOnce(ctx, t, c, data, size, nonce)
		if err == nil {
			if v[0] == "C" {
				return nil
			}
			return status.Errorf(codes.Internal, "redisstore: Complete: the claim is %v", v[2:])
		}
		if ctx.Err() != nil || status.Code(err) == codes.ResourceExhausted {
			return err
		}
		left := t.until.Sub(s.now())
		if left <= 0 || !sleep(ctx, s.stop, min(backoff, left)) {
			s.lost.Add(1)
			why := "before the claim's lease ended"
			if left > 0 {
				why = "before the store was closed"
			}
			return status.Error(codes.Unavailable, "redisstore: Complete: Redis did not answer "+strconv.Itoa(tries)+
				" tries "+why+": the outcome is lost, and a retry with the same key will run the request again; last error: "+
				err.Error())
		}
		backoff = min(2*backoff, maxCompleteBackoff)
	}
}

// completeOnce runs completeScript once for the call nonce.
func (s *Store) completeOnce(ctx context.Context, t *token, c dedupe.Claim, data []byte, size int64, nonce string) ([]any, error) {
	args := append(s.header(nonce, 11), t.tok, t.epoch, c.Scope.Identity, c.Scope.Key,
		c.Holder.Method, c.Holder.RequestHash[:], t.leaseEnd, t.size, data, size, s.channel)
	return s.run(ctx, nil, "complete", completeScript, t.key, args)
}

// Release implements [dedupe.Store]. It is not refused by the breaker,
// and tries up to three times.
func (s *Store) Release(ctx context.Context, c dedupe.Claim) error {
	t, err := s.ownedToken(c)
	if err != nil {
		return err
	}
	defer s.forget(t.tok)
	for attempt := 1; ; attempt++ {
		args := append(s.header(s.newToken(), 3), t.tok, t.epoch, s.channel)
		v, err := s.run(ctx, nil, "release", releaseScript, t.key, args)
		if err == nil {
			if v[0] == "C" || attempt > 1 { // after a lost reply, an earlier attempt may have released it
				return nil
			}
			return status.Error(codes.Internal, "redisstore: Release: the claim is already finished, or its lease ended")
		}
		if attempt == releaseAttempts || ctx.Err() != nil {
			return err
		}
		if !sleep(ctx, s.stop, time.Duration(attempt)*20*time.Millisecond) {
			return err
		}
	}
}

// sleep waits d, and says false if ctx or stop ended first.
func sleep(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-stop:
	}
	return false
}

// Wait implements [dedupe.Store]. It is woken by a Redis notification
// when the execution finishes, and polls every PollInterval in case the
// notification was lost. After Redis lost its data, it waits up to the
// fence for the owner to take its claim back.
func (s *Store) Wait(ctx context.Context, c dedupe.Claim) (*dedupe.Record, error) {
	t, ok := c.Token.(*token)
	if !ok || t == nil || t.store != s {
		return nil, status.Error(codes.Internal, "redisstore: Wait with a claim of another store")
	}
	ch := s.addWaiter(t.tok)
	defer func() { s.removeWaiter(t.tok, ch) }()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		tk, err := s.admit()
		if err != nil {
			return nil, err
		}
		args := append(s.header(s.newToken(), 2), t.tok, t.epoch)
		v, err := s.run(ctx, &tk, "wait", waitScript, t.key, args)
		if err != nil {
			return nil, err
		}
		switch v[0] {
		case "D":
			if len(v) < 4 {
				return nil, status.Error(codes.Unavailable, "redisstore: wait: unexpected reply")
			}
			return record(v[2], v[3], c.Holder)
		case "N":
			return nil, nil
		}
		d := min(s.poll, msArg(v, 2))
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ch:
			s.removeWaiter(t.tok, ch)
			ch = s.addWaiter(t.tok) // before the next check, so that no notification is missed
		case <-timer.C:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

func (s *Store) addWaiter(tok string) chan struct{} {
	ch := make(chan struct{})
	s.mu.Lock()
	s.waiters[tok] = append(s.waiters[tok], ch)
	s.mu.Unlock()
	return ch
}

func (s *Store) removeWaiter(tok string, ch chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.waiters[tok]
	for i, w := range ws {
		if w == ch {
			ws[i] = ws[len(ws)-1]
			ws = ws[:len(ws)-1]
			break
		}
	}
	if len(ws) == 0 {
		delete(s.waiters, tok)
	} else {
		s.waiters[tok] = ws
	}
}

// wake wakes this process's waiters of the execution tok.
func (s *Store) wake(tok string) {
	s.mu.Lock()
	ws := s.waiters[tok]
	delete(s.waiters, tok)
	s.mu.Unlock()
	for _, ch := range ws {
		close(ch)
	}
}

// forget drops tok from this process's claims in flight.
func (s *Store) forget(tok string) {
	if _, ok := s.owned.LoadAndDelete(tok); ok {
		s.nOwned.Add(-1)
	}
}

// observe notes the epoch Redis answered with; a new one while this
// process holds claims sends the heartbeat to take them back.
func (s *Store) observe(epoch string) {
	if cur := s.epoch.Load(); cur != nil && *cur == epoch {
		return
	}
	s.epoch.Store(&epoch)
	if s.nOwned.Load() > 0 {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// watch is the heartbeat: while this process holds claims, it checks
// every Heartbeat (and whenever Redis answers with a new epoch) that Redis
// still holds them, and takes back those lost with Redis's data.
func (s *Store) watch() {
	t := time.NewTicker(s.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		case <-s.kick:
		}
		s.retake()
		s.releaseOrphans()
	}
}

// releaseOrphans releases the claims whose reply was lost (a timeout, a
// broken connection): Redis may have applied them, and would then hold
// their scopes, for nobody, until their leases end.
func (s *Store) releaseOrphans() {
	now := s.now()
	var orphans []*token
	s.orphans.Range(func(k, v any) bool {
		if t := v.(*token); now.Before(t.until) {
			orphans = append(orphans, t)
		} else {
			s.orphans.Delete(k) // its lease ended: Redis drops it
		}
		return true
	})
	for _, t := range orphans {
		ctx, cancel := context.WithTimeout(context.Background(), s.op)
		args := append(s.header(s.newToken(), 3), t.tok, "", s.channel)
		_, err := s.run(ctx, nil, "release", releaseScript, t.key, args)
		cancel()
		if err != nil {
			return // Redis is away: the next beat tries again
		}
		s.orphans.Delete(t.tok)
	}
}

// retake takes back the claims of this process that Redis lost.
func (s *Store) retake() {
	now := s.now()
	var claims []*ownedClaim
	s.owned.Range(func(k, v any) bool {
		if o := v.(*ownedClaim); now.Before(o.t.until) {
			claims = append(claims, o)
		} else {
			s.forget(k.(string)) // its lease ended: it is not ours any more
		}
		return true
	})
	if len(claims) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.op)
	cur, err := s.rdb.HGet(ctx, s.gKey, "epoch").Result()
	cancel()
	if err != nil && !errors.Is(err, redis.Nil) {
		return // Redis is away: the next beat tries again
	}
	for _, o := range claims {
		if o.epoch == cur { // only this goroutine reads and writes o.epoch after Claim
			continue
		}
		args := append(s.header(s.newToken(), 7), o.t.tok, o.scope.Identity, o.scope.Key,
			o.fp.Method, o.fp.RequestHash[:], o.t.leaseEnd, o.t.size)
		ctx, cancel := context.WithTimeout(context.Background(), s.op)
		v, err := s.run(ctx, nil, "retake", retakeScript, o.t.key, args)
		cancel()
		if err != nil {
			return
		}
		if v[0] == "C" {
			o.epoch, _ = v[1].(string)
		}
	}
}

// Stats is a snapshot of a Store's size and counters, shared by every
// Store on the same Redis and Prefix.
type Stats struct {
	// Entries and InFlight count the entries held, and those in flight.
	Entries, InFlight int
	// Identities counts the identities that hold entries.
	Identities int
	// Bytes is what the entries and identities hold, as counted against
	// MaxBytes.
	Bytes int64
	// Evictions, Expirations, Oversized, Busy and OverQuota count what
	// the fields of the same names in dedupe.MemoryStats count: Busy and
	// OverQuota, refused claims only; Oversized, records kept as
	// tombstones.
	Evictions, Expirations, Oversized, Busy, OverQuota uint64
	// LeaseEnds counts claims dropped because their lease ended.
	LeaseEnds uint64
	// Fenced counts claims refused during a fence; Retaken, claims taken
	// back by their owners after Redis lost its data.
	Fenced, Retaken uint64
	// LostOutcomes counts the outcomes this Store gave up recording
	// because Redis did not answer before their claims' leases ended (or
	// before Close): their requests run again if retried. It is this
	// Store's own count, not shared.
	LostOutcomes uint64
	// Breaker is the state of this Store's breaker (not shared).
	Breaker breaker.State
}

// Stats reads the store's size and counters from Redis.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, s.op)
	defer cancel()
	p := s.rdb.Pipeline()
	g := p.HMGet(ctx, s.gKey, "n", "b", "ev", "ex", "ov", "busy", "quota", "le", "fenced", "retaken")
	inFlight := p.ZCard(ctx, s.prefix+"l")
	ids := p.HLen(ctx, s.prefix+"in")
	if _, err := p.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return Stats{}, status.Error(codes.Unavailable, "redisstore: stats: "+err.Error())
	}
	n := func(i int) int64 {
		if i < len(g.Val()) {
			if s, ok := g.Val()[i].(string); ok {
				v, _ := strconv.ParseInt(s, 10, 64)
				return v
			}
		}
		return 0
	}
	return Stats{
		Entries: int(n(0)), Bytes: n(1), InFlight: int(inFlight.Val()), Identities: int(ids.Val()),
		Evictions: uint64(n(2)), Expirations: uint64(n(3)), Oversized: uint64(n(4)), Busy: uint64(n(5)),
		OverQuota: uint64(n(6)), LeaseEnds: uint64(n(7)), Fenced: uint64(n(8)), Retaken: uint64(n(9)),
		LostOutcomes: s.lost.Load(), Breaker: s.br.State(),
	}, nil
}

// BreakerStats returns a snapshot of the breaker in front of Redis.
func (s *Store) BreakerStats() breaker.Stats { return s.br.Stats() }

var _ dedupe.Store = (*Store)(nil)
