package transfer

import (
	"math/bits"
	"sync"
)

// Receive chunks come in power-of-two classes so that results handed back
// with FetchResult.Release can be reused without Go zeroing (and the
// kernel faulting in) fresh memory for every fetch.
const (
	minChunkClass = 16 // 64 KiB
	maxChunkClass = 26 // 64 MiB; larger chunks are not pooled
)

type chunkPool struct {
	classes [maxChunkClass - minChunkClass + 1]sync.Pool
}

func chunkClass(n int) int {
	return max(minChunkClass, bits.Len(uint(n-1)))
}

// get returns a chunk of at least n bytes (len == cap).
func (p *chunkPool) get(n int) []byte {
	c := chunkClass(n)
	if c > maxChunkClass {
		return make([]byte, n)
	}
	if v, ok := p.classes[c-minChunkClass].Get().(*[]byte); ok {
		return (*v)[:cap(*v)]
	}
	return make([]byte, 1<<c)
}

func (p *chunkPool) put(b []byte) {
	c := bits.Len(uint(cap(b) - 1))
	if cap(b) == 0 || 1<<c != cap(b) || c < minChunkClass || c > maxChunkClass {
		return
	}
	b = b[:cap(b)]
	p.classes[c-minChunkClass].Put(&b)
}

// Release hands the memory of r's blocks back to the client that fetched
// them, for reuse by later fetches. Afterwards r.Blocks' payloads must not
// be used (they will be overwritten); r is emptied. Calling it is optional
// (without it the garbage collector frees the memory) and it is a no-op
// for memory the caller supplied in FetchRequest.Buffer.
func (r *FetchResult) Release() {
	if r.pool != nil {
		for _, c := range r.chunks {
			r.pool.put(c)
		}
	}
	*r = FetchResult{Outcome: r.Outcome, Duration: r.Duration}
}
