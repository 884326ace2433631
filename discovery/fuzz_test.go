package discovery

import (
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzParseInstance: a discovery record from the bucket, whatever its
// bytes, never panics the parser; one it accepts is valid and survives a
// re-encoding unchanged.
func FuzzParseInstance(f *testing.F) {
	good := Instance{ID: 0x42, Model: "m", Role: "aggregated", GRPCAddr: "10.0.0.1:50051", DPSize: 2, BlockSize: 16,
		KVCapacity: map[string]int{"device": 100}, ControlEndpoints: []string{"tcp://10.0.0.1:7000", "tcp://10.0.0.1:7001"}}
	b, _ := json.Marshal(good)
	f.Add(b)
	f.Add([]byte(`{"instance_id":1,"model":"m","role":"decode","grpc_addr":"[::1]:1","dp_size":1,"block_size":1}`))
	f.Add([]byte(`{"instance_id":1,"model":"m","role":"aggregated","grpc_addr":"0.0.0.0:1","dp_size":1,"block_size":1,"control_endpoints":["tcp://0.0.0.0:1"]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := parseInstance(b)
		if err != nil {
			return
		}
		if err := in.Validate(); err != nil {
			t.Fatalf("accepted an invalid record: %v", err)
		}
		again, _ := json.Marshal(in)
		in2, err := parseInstance(again)
		if err != nil || !reflect.DeepEqual(in, in2) {
			t.Fatalf("re-encoded record %s: %+v %v, want %+v", again, in2, err, in)
		}
	})
}
