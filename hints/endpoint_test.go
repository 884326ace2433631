package hints

import "testing"

func TestParseEndpointCanonical(t *testing.T) {
	cases := map[string]string{
		"tcp://127.0.0.1:23280":            "tcp://127.0.0.1:23280",
		"tcp://localhost:1":                "tcp://localhost:1",
		"tcp://Worker-3.example.com:65535": "tcp://Worker-3.example.com:65535",
		"tcp://host.:80":                   "tcp://host.:80",
		"tcp://10.0.0.7:0080":              "tcp://10.0.0.7:80",
		"tcp://[::1]:5":                    "tcp://[::1]:5",
		"tcp://[FD00:0:0::1]:5":            "tcp://[fd00::1]:5",
		"tcp://[::ffff:10.0.0.1]:5":        "tcp://[::ffff:10.0.0.1]:5",
	}
	for in, want := range cases {
		got, err := ParseEndpoint(in)
		if err != nil || got != want {
			t.Errorf("ParseEndpoint(%q) = %q, %v; want %q", in, got, err, want)
		}
		// Canonical forms are fixed points.
		if again, err := ParseEndpoint(got); err != nil || again != got {
			t.Errorf("ParseEndpoint(%q) = %q, %v; not a fixed point", got, again, err)
		}
	}
}

func TestParseEndpointRejects(t *testing.T) {
	long := "tcp://" + string(make([]byte, 300)) + ":1"
	for _, in := range []string{
		"", "tcp://", "tcp://h", "tcp://h:", "tcp://h:123456", "tcp://h:1x", "tcp://h :1", "tcp://h:1?x",
		"tcp://u@h:1", "udp://h:1", "TCP://h:1", "tcp://::1:5", "tcp://[::1]5", "tcp://[]:5", "tcp://[zz]:5",
		"tcp://0.0.0.0:1", "tcp://[::]:1", "tcp://[0:0::0]:1", "tcp://1.2.3:4", "tcp://01.2.3.4:5",
		"tcp://a..b:1", "tcp://a_-:1", "tcp://" + string(make([]byte, 64)) + "x:1", long,
	} {
		if got, err := ParseEndpoint(in); err == nil {
			t.Errorf("ParseEndpoint(%q) accepted as %q", in, got)
		} else if len(err.Error()) > 200 {
			t.Errorf("error for %d-byte input not bounded: %d bytes", len(in), len(err.Error()))
		}
	}
}
