package hints

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
)

// The engines' own envelope builders (vLLM's, in the seed) pass
// action_id, action_type and action_version through Python's str(), so a
// router that sends {"action_id": 123} is understood as "123". kvmesh
// reads those fields the same way: a JSON number becomes the text str()
// gives for the value json.loads makes of it; objects, lists, booleans
// and null stay errors (str() would turn them into "{...}", "True" or
// "None", names no router means).

// maxIntDigits is Python's int/str conversion limit (sys.int_info
// default_max_str_digits): json.loads refuses longer integers.
const maxIntDigits = 4300

// actionField reads a scalar action field: a string as is, a number as
// Python's str() of it.
func actionField(m map[string]json.RawMessage, prefix, name string) (string, error) {
	raw, ok := m[name]
	if !ok {
		return "", &Error{prefix + name, "missing"}
	}
	if kind(raw) != "number" {
		return stringField(m, prefix, name)
	}
	s, err := pythonNumberString(strings.TrimSpace(string(raw)))
	if err != nil {
		return "", &Error{prefix + name, err.Error() + ", got " + show(raw)}
	}
	return s, nil
}

// numberError says why a JSON number has no str() form kvmesh accepts.
type numberError string

func (e numberError) Error() string { return string(e) }

// pythonNumberString is str(json.loads(lit)) for a valid JSON number
// literal. An integer literal is a Python int: its digits exactly ("-0"
// is 0). Any other literal is a float: repr's shortest round-trip digits,
// positional with a ".0" when 1e-4 ≤ |x| < 1e16, else d.ddde±XX. A float
// beyond float64 (json.loads gives inf) is refused, not sent as "inf".
func pythonNumberString(lit string) (string, error) {
	if !strings.ContainsAny(lit, ".eE") {
		digits := strings.TrimPrefix(lit, "-")
		if len(digits) > maxIntDigits {
			return "", numberError("integer longer than 4300 digits")
		}
		if digits == "0" {
			return "0", nil
		}
		return lit, nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return "", numberError("number beyond a 64-bit float")
	}
	return pythonFloatRepr(f), nil
}

// pythonFloatRepr is Python's repr(float) of a finite f.
func pythonFloatRepr(f float64) string {
	// Shortest round-trip digits and the decimal exponent: "-d.ddde±XX".
	e := strconv.FormatFloat(f, 'e', -1, 64)
	sign := ""
	if e[0] == '-' {
		sign, e = "-", e[1:]
	}
	mant, expText, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expText)
	digits := strings.Replace(mant, ".", "", 1)
	if f == 0 {
		return sign + "0.0"
	}
	if exp < -4 || exp >= 16 {
		out := digits[:1]
		if len(digits) > 1 {
			out += "." + digits[1:]
		}
		es := "+"
		if exp < 0 {
			es, exp = "-", -exp
		}
		return sign + out + "e" + es + leftPad2(exp)
	}
	if exp < 0 {
		return sign + "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return sign + digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return sign + digits[:exp+1] + "." + digits[exp+1:]
}

// leftPad2 writes n with at least two digits, as Python's exponents are.
func leftPad2(n int) string {
	if n < 10 {
		return "0" + strconv.Itoa(n)
	}
	return strconv.Itoa(n)
}
