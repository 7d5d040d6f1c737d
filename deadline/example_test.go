package deadline_test

import (
	"fmt"
	"time"

	"github.com/stormguard/stormguard/deadline"
)

func ExampleParseHeader() {
	for _, v := range []string{"250", "0", "9999999999", "-5", "1.5", "250ms", " 250", "12345678901", ""} {
		d, ok := deadline.ParseHeader(v)
		fmt.Printf("%-13q %v %v\n", v, d, ok)
	}
	// Output:
	// "250"         250ms true
	// "0"           0s true
	// "9999999999"  720h0m0s true
	// "-5"          0s false
	// "1.5"         0s false
	// "250ms"       0s false
	// " 250"        0s false
	// "12345678901" 0s false
	// ""            0s false
}

func ExampleFormatHeader() {
	fmt.Println(deadline.FormatHeader(1500*time.Microsecond), deadline.FormatHeader(-time.Second), deadline.FormatHeader(2*time.Second))
	// Output: 1 0 2000
}
