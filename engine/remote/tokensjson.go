package remote

import (
	"encoding/json"
	"fmt"

	"github.com/kvmesh/kvmesh/kv"
)

// JSONWithTokens is v as a JSON object whose first field, key, holds ids,
// followed by v's own fields. A prompt's token ids are most of an engine
// request's bytes, and encoding/json writes each through reflection; here
// they are written directly. v must marshal to a JSON object with no field
// named key (its token field tagged `json:"-"`); key is written as given,
// so it must need no escaping.
func JSONWithTokens(key string, ids []kv.Token, v any) ([]byte, error) {
	rest, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if len(rest) < 2 || rest[0] != '{' || rest[len(rest)-1] != '}' {
		return nil, fmt.Errorf("a request body must be a JSON object, not %.20s", rest)
	}
	buf := make([]byte, 0, len(key)+len(rest)+4+len(ids)*7)
	buf = append(buf, '{', '"')
	buf = append(buf, key...)
	buf = append(buf, '"', ':')
	buf = AppendTokenIDs(buf, ids)
	if len(rest) > 2 {
		buf = append(buf, ',')
	}
	return append(buf, rest[1:]...), nil
}

// digitPairs holds "00" to "99", two bytes each.
const digitPairs = "00010203040506070809" + "10111213141516171819" + "20212223242526272829" + "30313233343536373839" +
	"40414243444546474849" + "50515253545556575859" + "60616263646566676869" + "70717273747576777879" +
	"80818283848586878889" + "90919293949596979899"

// AppendTokenIDs appends ids as a JSON array of integers, byte for byte
// what encoding/json writes for them ("[]" when there are none).
func AppendTokenIDs(buf []byte, ids []kv.Token) []byte {
	buf = append(buf, '[')
	for i, id := range ids {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendUint32(buf, uint32(id))
	}
	return append(buf, ']')
}

// appendUint32 appends v in decimal, two digits a step.
func appendUint32(buf []byte, v uint32) []byte {
	if v < 10 {
		return append(buf, byte('0'+v))
	}
	var t [10]byte
	n := len(t)
	for v >= 100 {
		q := v / 100
		r := (v - q*100) * 2
		n -= 2
		t[n], t[n+1] = digitPairs[r], digitPairs[r+1]
		v = q
	}
	if v >= 10 {
		n -= 2
		t[n], t[n+1] = digitPairs[v*2], digitPairs[v*2+1]
	} else {
		n--
		t[n] = byte('0' + v)
	}
	return append(buf, t[n:]...)
}
