package remote

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

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
	buf := make([]byte, 0, len(key)+len(rest)+4+len(ids)*len(",4294967295"))
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
// what encoding/json writes for them ("[]" when there are none). Ids under
// a million (every vocabulary's) are written by width into room made once.
func AppendTokenIDs(buf []byte, ids []kv.Token) []byte {
	const widest = len(",4294967295")
	n := len(buf)
	buf = slices.Grow(buf, 2+len(ids)*widest)[:n+2+len(ids)*widest]
	buf[n] = '['
	n++
	for i, id := range ids {
		if i > 0 {
			buf[n] = ','
			n++
		}
		v := uint32(id)
		switch {
		case v < 10:
			buf[n] = byte('0' + v)
			n++
		case v < 100:
			buf[n], buf[n+1] = digitPairs[v*2], digitPairs[v*2+1]
			n += 2
		case v < 1000:
			q, r := v/100, v%100*2
			buf[n], buf[n+1], buf[n+2] = byte('0'+q), digitPairs[r], digitPairs[r+1]
			n += 3
		case v < 10_000:
			q, r := v/100*2, v%100*2
			buf[n], buf[n+1], buf[n+2], buf[n+3] = digitPairs[q], digitPairs[q+1], digitPairs[r], digitPairs[r+1]
			n += 4
		case v < 100_000:
			q, m := v/10_000, v%10_000
			h, r := m/100*2, m%100*2
			buf[n], buf[n+1], buf[n+2], buf[n+3], buf[n+4] = byte('0'+q), digitPairs[h], digitPairs[h+1], digitPairs[r], digitPairs[r+1]
			n += 5
		case v < 1_000_000:
			q, m := v/10_000*2, v%10_000
			h, r := m/100*2, m%100*2
			buf[n], buf[n+1], buf[n+2], buf[n+3], buf[n+4], buf[n+5] = digitPairs[q], digitPairs[q+1], digitPairs[h], digitPairs[h+1], digitPairs[r], digitPairs[r+1]
			n += 6
		default:
			n += len(strconv.AppendUint(buf[n:n], uint64(v), 10))
		}
	}
	buf[n] = ']'
	return buf[:n+1]
}
