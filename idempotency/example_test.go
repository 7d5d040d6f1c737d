package idempotency_test

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/idempotency"
)

func ExampleValidateKey() {
	for _, k := range []string{"order-42/charge", "", "order 42", strings.Repeat("k", 300)} {
		if err := idempotency.ValidateKey(k); err != nil {
			s := status.Convert(err)
			fmt.Println(s.Code(), "-", s.Message())
			continue
		}
		fmt.Println("ok:", k)
	}
	// Output:
	// ok: order-42/charge
	// InvalidArgument - idempotency: empty idempotency-key
	// InvalidArgument - idempotency: idempotency-key has byte 0x20 at offset 5; only printable ASCII without spaces (0x21-0x7e) is allowed
	// InvalidArgument - idempotency: idempotency-key is 300 bytes long; at most 255 are allowed
}
