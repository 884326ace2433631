package kv

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
)

// Known answers computed with python3-xxhash (an independent XXH3), frozen
// here so the test also runs where that package is absent.
func TestKnownAnswers(t *testing.T) {
	if got := HashTokens(nil, 1337); got != 15128690059815094969 {
		t.Errorf("xxh3(empty, 1337) = %d", got)
	}
	toks := make([]Token, 16)
	for i := range toks {
		toks[i] = Token(i + 1)
	}
	cases := []struct {
		lora, salt string
		seed       uint64
		local, seq []uint64
	}{
		{"", "", 1337,
			[]uint64{14643705804678351452, 16777012769546811212, 483935686894639516, 135165725823939817},
			[]uint64{14643705804678351452, 4945711292740353085, 12583592247330656132, 1921452330601040443}},
		{"my-lora", "", 12827409268353072861,
			[]uint64{15671544057904749233, 7919241211032067838, 6437396758604329923, 17441097917543692410},
			[]uint64{15671544057904749233, 15486599009994050725, 8291072227036031577, 4669480577287596989}},
		{"", "tenant-a", 1948188790972764086,
			[]uint64{5738685477468498325, 11202231085456067787, 9318114775459440904, 1534360889204087204},
			[]uint64{5738685477468498325, 1076233986426276607, 14251413665512820044, 431597180366312551}},
		{"my-lora", "tenant-a", 14775598059325835610,
			[]uint64{6157910915076630503, 3256431856703716508, 746293535497476961, 3659038135344137977},
			[]uint64{6157910915076630503, 9770935122131878621, 5066185753532879290, 16165299910623293588}},
	}
	for _, c := range cases {
		h := NewHasher(4, c.lora, c.salt)
		if h.Seed != c.seed {
			t.Errorf("seed(%q,%q) = %d, want %d", c.lora, c.salt, h.Seed, c.seed)
		}
		// A partial tail (two extra tokens) must not be hashed.
		local, seq := h.Blocks(append(toks, 99, 100))
		if fmt.Sprint(local) != fmt.Sprint(c.local) || fmt.Sprint(seq) != fmt.Sprint(c.seq) {
			t.Errorf("(%q,%q): local %v seq %v, want %v %v", c.lora, c.salt, local, seq, c.local, c.seq)
		}
	}
}

// requireTools makes missing cross-check tools a failure (CI sets it).
func requireTools(t *testing.T, what string, err error) {
	t.Helper()
	if os.Getenv("KVMESH_REQUIRE_TOOLS") != "" {
		t.Fatalf("%s unavailable: %v", what, err)
	}
	t.Skipf("%s unavailable: %v", what, err)
}

// TestCrossCheckPython compares random blocks, seeds and chains against
// python3-xxhash at run time.
func TestCrossCheckPython(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import xxhash").Run(); err != nil {
		requireTools(t, "python3-xxhash", err)
	}
	r := rand.New(rand.NewPCG(7, 9))
	var script strings.Builder
	script.WriteString("import sys, xxhash\nfor line in sys.stdin:\n    h, s = line.split()\n    print(xxhash.xxh3_64_intdigest(bytes.fromhex(h), seed=int(s)) if h != '-' else xxhash.xxh3_64_intdigest(b'', seed=int(s)))\n")
	var in strings.Builder
	var want []uint64
	for i := 0; i < 200; i++ {
		n := r.IntN(130)
		toks := make([]Token, n)
		b := make([]byte, 4*n)
		for j := range toks {
			toks[j] = r.Uint32()
			binary.LittleEndian.PutUint32(b[4*j:], toks[j])
		}
		seed := r.Uint64()
		if i%3 == 0 {
			seed = BaseSeed
		}
		hx := hex.EncodeToString(b)
		if hx == "" {
			hx = "-"
		}
		fmt.Fprintf(&in, "%s %d\n", hx, seed)
		want = append(want, uint64(HashTokens(toks, seed)))
	}
	// Chain hashes too.
	for i := 0; i < 50; i++ {
		p, l := r.Uint64(), r.Uint64()
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], p)
		binary.LittleEndian.PutUint64(b[8:], l)
		fmt.Fprintf(&in, "%s %d\n", hex.EncodeToString(b[:]), BaseSeed)
		want = append(want, uint64(ChainHash(SeqHash(p), LocalHash(l))))
	}
	cmd := exec.Command(py, "-c", script.String())
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	got := strings.Fields(string(out))
	if len(got) != len(want) {
		t.Fatalf("python printed %d lines, want %d", len(got), len(want))
	}
	for i, g := range got {
		v, _ := strconv.ParseUint(g, 10, 64)
		if v != want[i] {
			t.Errorf("case %d: python %d, kv %d", i, v, want[i])
		}
	}
}

// TestCrossCheckXXHsum checks seed-0 XXH3 against Debian's xxhsum CLI.
func TestCrossCheckXXHsum(t *testing.T) {
	if _, err := exec.LookPath("xxhsum"); err != nil {
		requireTools(t, "xxhsum", err)
	}
	for _, s := range []string{"", "abc", "my-lora", strings.Repeat("kvmesh", 100)} {
		cmd := exec.Command("xxhsum", "-H3")
		cmd.Stdin = strings.NewReader(s)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("xxhsum: %v", err)
		}
		// "XXH3 (stdin) = 78af5f94892f3950" or "78af5f94892f3950  stdin"
		var hx string
		for _, f := range strings.Fields(string(out)) {
			if len(f) == 16 {
				hx = f
			}
		}
		want, err := strconv.ParseUint(hx, 16, 64)
		if err != nil {
			t.Fatalf("xxhsum output %q", out)
		}
		toks := []byte(s)
		got := xxh3.Hash(toks)
		if got != want {
			t.Errorf("%q: xxhsum %x, kv %x", s, want, got)
		}
	}
}

func TestSeedEmptyIsAbsent(t *testing.T) {
	if Seed("", "") != BaseSeed {
		t.Fatal("empty lora/salt must leave the base seed")
	}
	if Seed("a", "") == Seed("", "a") {
		t.Fatal("lora and salt must mix differently")
	}
}

func TestBlockCounts(t *testing.T) {
	if NumFullBlocks(1800, 64) != 28 || BlocksNeeded(1800, 64) != 29 {
		t.Fatal("1800 tokens at 64: 28 hashed blocks, 29 needed")
	}
	if NumFullBlocks(10, 0) != 0 || BlocksNeeded(10, 0) != 0 {
		t.Fatal("block size 0 must not divide")
	}
}

func BenchmarkLocalHashes8k(b *testing.B) {
	toks := make([]Token, 8192)
	for i := range toks {
		toks[i] = Token(i * 7)
	}
	dst := make([]LocalHash, 0, 128)
	b.SetBytes(int64(len(toks) * 4))
	for b.Loop() {
		dst = LocalHashes(dst[:0], toks, 64, BaseSeed)
	}
}

// The hash-domain views share memory and keep nil, length and capacity, so
// wire and table edges convert without copying.
func TestHashViews(t *testing.T) {
	raw := make([]uint64, 2, 5)
	raw[0], raw[1] = 7, 8
	eng := AsHashes[EngineHash](raw)
	if len(eng) != 2 || cap(eng) != 5 || eng[1] != 8 {
		t.Fatalf("view %v len %d cap %d", eng, len(eng), cap(eng))
	}
	eng[0] = 9
	if raw[0] != 9 {
		t.Fatal("AsHashes copied")
	}
	back := RawHashes(eng[:0])
	if len(back) != 0 || cap(back) != 5 || back == nil {
		t.Fatalf("empty view lost its buffer: len %d cap %d nil %v", len(back), cap(back), back == nil)
	}
	if RawHashes[SeqHash](nil) != nil || AsHashes[LocalHash](nil) != nil {
		t.Fatal("nil did not stay nil")
	}
}
