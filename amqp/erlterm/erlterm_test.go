package erlterm

import "testing"

// The expected strings are what Erlang/OTP 25's ~p prints.
func TestFloat(t *testing.T) {
	for _, tc := range []struct {
		f    float64
		want string
	}{
		{1.5, "1.5"}, {2, "2.0"}, {100, "100.0"}, {1000, "1.0e3"}, {12345, "12345.0"},
		{1.5e7, "1.5e7"}, {1e10, "1.0e10"}, {1e22, "1.0e22"}, {1e20, "1.0e20"}, {0.001, "0.001"},
		{0.0001, "0.0001"}, {0.0015, "0.0015"}, {0.1, "0.1"}, {1e-5, "1.0e-5"}, {1.25e-7, "1.25e-7"},
		{0.0123, "0.0123"}, {123456.789, "123456.789"}, {123456, "123456.0"}, {0, "0.0"}, {-2.5, "-2.5"},
	} {
		if got := Float(tc.f); got != tc.want {
			t.Errorf("Float(%v) = %q, want %q", tc.f, got, tc.want)
		}
	}
}
