package transfer

import (
	"fmt"
	"slices"

	"github.com/kvmesh/kvmesh/kv"
)

// LayerReader is a source that reads one layer of a block at a time, as
// engine/sim's Engine does (its kv.SeqHash is a uint64).
type LayerReader interface {
	Pin(hashes []uint64) (n int, release func())
	// ReadPayload copies layer's payload of a cached block into dst (at
	// least layerSize bytes) and returns the bytes written.
	ReadPayload(seq uint64, layer int, dst []byte) (int, error)
}

// Layered adapts a LayerReader whose blocks have layers layers of layerSize
// bytes into a BlockSource.
func Layered(r LayerReader, layers, layerSize int) BlockSource {
	return layered{r: r, layers: layers, layerSize: layerSize}
}

type layered struct {
	r                 LayerReader
	layers, layerSize int
}

func (l layered) Pin(hashes []uint64) (int, func()) { return l.r.Pin(hashes) }

func (l layered) ReadBlock(hash uint64, dst []byte) ([]byte, error) {
	if l.layers <= 0 || l.layerSize <= 0 {
		return dst, fmt.Errorf("layered source: %d layers of %d bytes", l.layers, l.layerSize)
	}
	start := len(dst)
	need := l.layers * l.layerSize
	dst = slices.Grow(dst, need)[:start+need]
	for layer := 0; layer < l.layers; layer++ {
		p := dst[start+layer*l.layerSize : start+(layer+1)*l.layerSize]
		n, err := l.r.ReadPayload(hash, layer, p)
		if err != nil {
			return dst[:start], fmt.Errorf("block %016x layer %d: %w", hash, layer, err)
		}
		if n != l.layerSize {
			return dst[:start], fmt.Errorf("block %016x layer %d: read %d bytes, want %d", hash, layer, n, l.layerSize)
		}
	}
	return dst, nil
}

// Layers splits a delivered block into layers of layerSize bytes (aliasing
// its payload) with each layer's kv.Checksum, the shape engines insert.
func (b Block) Layers(layerSize int) (layers [][]byte, sums []uint64, err error) {
	if layerSize <= 0 || len(b.Payload)%layerSize != 0 {
		return nil, nil, fmt.Errorf("block %016x: %d bytes do not split into layers of %d", b.Hash, len(b.Payload), layerSize)
	}
	n := len(b.Payload) / layerSize
	layers = make([][]byte, n)
	sums = make([]uint64, n)
	for i := range layers {
		layers[i] = b.Payload[i*layerSize : (i+1)*layerSize : (i+1)*layerSize]
		sums[i] = kv.Checksum(layers[i])
	}
	return layers, sums, nil
}
