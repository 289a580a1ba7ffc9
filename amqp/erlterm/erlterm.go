// Package erlterm renders values the way RabbitMQ's reply texts and API errors show them: those
// texts format a decoded Erlang term with ~p, and clients and tests compare them, so Warren's texts
// must use the same shapes. Only the pieces shared by more than one text live here; each caller
// keeps the rules of its own source (AMQP field tables, JSON bodies).
package erlterm

import (
	"math"
	"strconv"
	"strings"
)

// Float renders f as Erlang/OTP 25's ~p does: the shortest digits that read back exactly, in
// plain or scientific notation, whichever is shorter (plain on a tie), always with a fractional
// part: 2.0, 1.5e7, 1.0e-5.
func Float(f float64) string {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	sign := ""
	if math.Signbit(f) {
		sign, f = "-", -f
	}
	if f == 0 {
		return sign + "0.0"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	digits := strings.Replace(mant, ".", "", 1)
	// Scientific: d.ddd (at least one fractional digit) e exp.
	sci := digits[:1] + "." + digits[1:]
	if len(digits) == 1 {
		sci += "0"
	}
	sci += "e" + strconv.Itoa(exp)
	// Plain: the decimal point after exp+1 digits.
	var plain string
	switch point := exp + 1; {
	case point <= 0:
		plain = "0." + strings.Repeat("0", -point) + digits
	case point >= len(digits):
		plain = digits + strings.Repeat("0", point-len(digits)) + ".0"
	default:
		plain = digits[:point] + "." + digits[point:]
	}
	if len(sci) < len(plain) {
		return sign + sci
	}
	return sign + plain
}
