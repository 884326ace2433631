package transfer

import "sync"

// Receive chunks are pooled by exact size, so that results handed back with
// FetchResult.Release are reused without Go zeroing (and the kernel
// faulting in) fresh memory for every fetch. Chunk sizes are whole block
// frames plus status room, and block sizes are fixed per deployment, so a
// handful of sizes recur; the number of sizes pooled is capped all the same.
const (
	maxChunkSizes  = 64
	maxPooledChunk = 64 << 20
)

type chunkPool struct {
	mu    sync.RWMutex
	sizes map[int]*sync.Pool
}

// get returns a chunk of exactly n bytes.
func (p *chunkPool) get(n int) []byte {
	p.mu.RLock()
	sp := p.sizes[n]
	p.mu.RUnlock()
	if sp != nil {
		if v, ok := sp.Get().(*[]byte); ok {
			return *v
		}
	}
	return make([]byte, n)
}

func (p *chunkPool) put(b []byte) {
	n := len(b)
	if n == 0 || n > maxPooledChunk || cap(b) != n {
		return
	}
	p.mu.RLock()
	sp := p.sizes[n]
	p.mu.RUnlock()
	if sp == nil {
		p.mu.Lock()
		if p.sizes == nil {
			p.sizes = make(map[int]*sync.Pool)
		}
		if sp = p.sizes[n]; sp == nil {
			if len(p.sizes) >= maxChunkSizes {
				p.mu.Unlock()
				return
			}
			sp = new(sync.Pool)
			p.sizes[n] = sp
		}
		p.mu.Unlock()
	}
	sp.Put(&b)
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
