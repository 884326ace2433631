package events

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kvmesh/kvmesh/kv"
)

// systemPython is Debian's interpreter, which has python3-zmq and
// python3-msgpack; a pyenv python on PATH usually has neither.
const systemPython = "/usr/bin/python3"

func requirePythonTools(t *testing.T) {
	t.Helper()
	out, err := exec.Command(systemPython, "-c", "import zmq, msgpack").CombinedOutput()
	if err == nil {
		return
	}
	msg := "python3-zmq/python3-msgpack unavailable: " + strings.TrimSpace(string(out)) + " " + err.Error()
	if os.Getenv("KVMESH_REQUIRE_TOOLS") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// startPythonPublisher runs testdata/vllm_pub.py and returns its endpoints
// and the expected listen lines it computed on its own.
func startPythonPublisher(t *testing.T) (pubEP, replayEP string, want []string, stop func()) {
	t.Helper()
	expected := filepath.Join(t.TempDir(), "expected.jsonl")
	cmd := exec.Command(systemPython, filepath.Join("testdata", "vllm_pub.py"), expected)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = func() {
		_ = stdin.Close() // the script exits when stdin closes
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("publisher script: %v\n%s", err, stderr.String())
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Error("publisher script did not exit")
		}
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 3 || f[0] != "READY" {
		stop()
		t.Fatalf("script said %q (%v)\n%s", line, err, stderr.String())
	}
	raw, err := os.ReadFile(expected)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	return f[1], f[2], strings.Split(strings.TrimSpace(string(raw)), "\n"), stop
}

// sameJSON compares two JSON lines exactly, big integers included.
func sameJSON(t *testing.T, got, want string) bool {
	t.Helper()
	parse := func(s string) any {
		d := json.NewDecoder(strings.NewReader(s))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("bad JSON %q: %v", s, err)
		}
		return v
	}
	return reflect.DeepEqual(parse(got), parse(want))
}

func TestInteropPythonListen(t *testing.T) {
	requirePythonTools(t)
	defer goleak.VerifyNone(t, leakOpts...)
	pubEP, replayEP, want, stop := startPythonPublisher(t)
	defer stop()
	var out bytes.Buffer
	n, err := Listen(context.Background(), ListenConfig{Endpoint: pubEP, ReplayEndpoint: replayEP,
		Topic: "kv@", Count: len(want), Timeout: 20 * time.Second, Logger: quietLogger()}, &out)
	if err != nil {
		t.Fatalf("Listen: %v (saw %d)\n%s", err, n, out.String())
	}
	got := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d:\n%s", len(got), len(want), out.String())
	}
	for i := range want {
		if !sameJSON(t, got[i], want[i]) {
			t.Errorf("line %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
}

func TestInteropPythonSubscriber(t *testing.T) {
	requirePythonTools(t)
	defer goleak.VerifyNone(t, leakOpts...)
	pubEP, replayEP, want, stop := startPythonPublisher(t)
	defer stop()
	s, c, stopSub := runSub(t, Config{Endpoint: pubEP, ReplayEndpoint: replayEP, Instance: 5, BlockSize: 4})
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, dels := c.snapshot()
		if len(dels) > 0 && dels[len(dels)-1].Seq >= 9 { // past the scripted batches
			break
		}
		if time.Now().After(deadline) {
			stopSub()
			t.Fatalf("timed out; stats %+v", s.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopSub()
	evs, dels := c.snapshot()
	checkContiguous(t, dels)
	st := s.Stats()
	if st.Malformed+st.BadFrames+st.Lost+st.UnknownEvents != 0 || st.Replayed < 3 {
		t.Fatalf("stats %+v", st)
	}
	// Every wire event of the script became one kv event (none is dropped:
	// all media are known, all stores have full blocks).
	scripted := evs
	if len(scripted) != len(want) {
		t.Fatalf("got %d kv events, want %d", len(scripted), len(want))
	}
	tiers := []kv.Tier{kv.TierDevice, kv.TierDevice, kv.TierHost, kv.TierDevice, kv.TierHost,
		kv.TierDevice, kv.TierDevice, kv.TierDevice, kv.TierDevice, kv.TierDisk, kv.TierHost, kv.TierDisk,
		kv.TierDevice, kv.TierDevice, kv.TierDevice}
	// The salt of every salted block stored so far: a continuation names
	// none on the wire and must hash with its parent's.
	salts := map[kv.EngineHash]string{}
	sawSalted := 0
	for i, line := range want {
		var w struct {
			Seq          uint64
			DPRank       uint32 `json:"dp_rank"`
			Type         string
			EngineHashes []kv.EngineHash `json:"engine_hashes"`
			Parent       *kv.EngineHash
			TokenIDs     []uint32 `json:"token_ids"`
			BlockSize    int      `json:"block_size"`
			LoRAName     *string  `json:"lora_name"`
			CacheSalt    *string  `json:"cache_salt"`
		}
		if err := json.Unmarshal([]byte(line), &w); err != nil {
			t.Fatal(err)
		}
		e := scripted[i]
		if e.Kind.String() != w.Type || e.Worker != (kv.WorkerKey{Instance: 5, DPRank: w.DPRank}) || e.ID != uint64(i+1) {
			t.Fatalf("event %d: %+v vs %s", i, e, line)
		}
		if e.Kind != kv.EventCleared && e.Tier != tiers[i] {
			t.Errorf("event %d: tier %v, want %v", i, e.Tier, tiers[i])
		}
		switch e.Kind {
		case kv.EventRemoved:
			if !reflect.DeepEqual(e.Removed, w.EngineHashes) {
				t.Errorf("event %d: removed %v, want %v", i, e.Removed, w.EngineHashes)
			}
		case kv.EventStored:
			lora := ""
			if w.LoRAName != nil {
				lora = *w.LoRAName
			}
			salt := ""
			if w.CacheSalt != nil {
				salt = *w.CacheSalt
			} else if w.Parent != nil {
				salt = salts[*w.Parent]
			}
			if salt != "" {
				sawSalted++
				for _, h := range w.EngineHashes {
					salts[h] = salt
				}
			}
			seed := kv.Seed(lora, salt)
			if len(e.Blocks) != len(w.EngineHashes) || e.HasParent != (w.Parent != nil) || (w.Parent != nil && e.Parent != *w.Parent) || e.LoRA != lora || e.Salt != salt {
				t.Fatalf("event %d: %+v vs %s", i, e, line)
			}
			for j, b := range e.Blocks {
				local := kv.HashTokens(w.TokenIDs[j*4:(j+1)*4], seed)
				if b.EngineHash != w.EngineHashes[j] || b.LocalHash != local {
					t.Errorf("event %d block %d: %+v, want engine %d local %d", i, j, b, w.EngineHashes[j], local)
				}
			}
		}
	}
	if sawSalted != 3 { // the script's two salted stores and one continuation
		t.Fatalf("%d salted stores, want 3", sawSalted)
	}
}
