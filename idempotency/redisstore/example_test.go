package redisstore_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency/dedupe"
	"github.com/stormguard/stormguard/idempotency/redisstore"
	"github.com/stormguard/stormguard/interceptor"
)

// Every replica of a payment service deduplicates keyed writes in one
// Redis: a retry that lands on another replica replays the first
// replica's outcome instead of charging again. The store is used here
// directly to show what the server interceptor does with it.
func Example() {
	rdb := redis.NewClient(&redis.Options{
		Addr:                  redisAddr, // the replicas' shared Redis
		ContextTimeoutEnabled: true,      // required: deadlines bound each command
	})
	defer rdb.Close()
	store, err := redisstore.New(redisstore.Config{
		Client: rdb,
		Prefix: "{example}:",
		Fence:  200 * time.Millisecond, // short for the example; the default is 5s
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	// Each replica's server: the suite's interceptors, deduplicating in
	// the shared store.
	guard := interceptor.NewServer(interceptor.WithDedupe(dedupe.NewServer(dedupe.Config{Store: store})))
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(guard.Unary()), grpc.ChainStreamInterceptor(guard.Stream()))
	defer srv.Stop()

	ctx := context.Background()
	scope := dedupe.Scope{Identity: "alice", Key: "order-1"}
	fp := dedupe.Fingerprint{Method: "/payments.v1.Payments/Charge", RequestHash: sha256.Sum256([]byte("10 EUR"))}

	// A new store refuses claims for the fence: had Redis lost the
	// claims of running handlers, their owners would take them back.
	_, err = store.Claim(ctx, scope, fp)
	fmt.Println("first use:", status.Code(err))
	time.Sleep(250 * time.Millisecond)

	c, err := store.Claim(ctx, scope, fp)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("first attempt:", c.State) // run the handler, then:
	if err := store.Complete(ctx, c, &dedupe.Record{Fingerprint: fp, Response: []byte("charged")}); err != nil {
		log.Fatal(err)
	}

	c, err = store.Claim(ctx, scope, fp) // the retry, on any replica
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("retry:", c.State, string(c.Record.Response))
	// Output:
	// first use: Unavailable
	// first attempt: OWNED
	// retry: DONE charged
}
