package discovery

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// A signed record is the record's JSON with two members appended,
//
//	{...record...,"signed_at":<unix s>,"sig":"<hex HMAC-SHA256>"}
//
// the HMAC, under Config.Key, being over the bytes before `,"sig"` closed
// with `}`. Signing the bytes as written (not a re-encoding) keeps a
// record from a newer worker, with members this reader does not know,
// verifiable. signed_at bounds how long a copy of a record (a dead
// worker's, replayed by someone who can write the bucket) is believed.
const (
	sigMember     = `,"sig":"`
	sigLen        = sha256.Size * 2
	signedSuffix  = len(sigMember) + sigLen + len(`"}`)
	maxRecordSkew = 5 * time.Minute
)

// errUnsigned and errBadSignature refuse records a keyed reader cannot
// trust: anyone who can write the bucket could have put them there.
var (
	errUnsigned     = errors.New("record is not signed with the fleet's key")
	errBadSignature = errors.New("record signature does not verify under the fleet's key")
)

// signRecord returns record (a JSON object) signed at now under key;
// without a key, record itself.
func signRecord(key, record []byte, now time.Time) []byte {
	if len(key) == 0 {
		return record
	}
	body := make([]byte, 0, len(record)+32+signedSuffix)
	body = append(body, record[:len(record)-1]...)
	body = append(body, `,"signed_at":`...)
	body = strconv.AppendInt(body, now.Unix(), 10)
	mac := recordMAC(key, append(body, '}'))
	body = append(body, sigMember...)
	body = hex.AppendEncode(body, mac)
	return append(body, `"}`...)
}

func recordMAC(key, signed []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(signed)
	return m.Sum(nil)
}

// verifyRecord checks val's signature under key and its age at now.
func verifyRecord(key, val []byte, signedAt int64, now time.Time) error {
	n := len(val)
	if n < signedSuffix || !bytes.Equal(val[n-signedSuffix:n-signedSuffix+len(sigMember)], []byte(sigMember)) || !bytes.HasSuffix(val, []byte(`"}`)) {
		return errUnsigned
	}
	got, err := hex.DecodeString(string(val[n-sigLen-2 : n-2]))
	if err != nil {
		return errBadSignature
	}
	signed := append(bytes.Clone(val[:n-signedSuffix]), '}')
	if !hmac.Equal(got, recordMAC(key, signed)) {
		return errBadSignature
	}
	if age := now.Sub(time.Unix(signedAt, 0)); age > maxRecordSkew || age < -maxRecordSkew {
		return fmt.Errorf("record signed %v ago, outside ±%v: a stale copy, or a clock far off", age.Round(time.Second), maxRecordSkew)
	}
	return nil
}

// parseSigned decodes a record and, when the watcher holds a key, checks
// its signature before anything in it is believed.
func (d *Discovery) parseSigned(val []byte, now time.Time) (Instance, error) {
	in, err := parseInstance(val)
	if err != nil || len(d.cfg.Key) == 0 {
		return in, err
	}
	if err := verifyRecord(d.cfg.Key, val, in.SignedAt, now); err != nil {
		return Instance{}, fmt.Errorf("instance %x: %w", in.ID, err)
	}
	return in, nil
}
