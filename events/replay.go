package events

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// FetchReplay asks a vLLM replay (ROUTER) socket for every buffered batch
// with seq ≥ start and calls fn for each, in the order received, until the
// end marker. A fresh DEALER per call keeps a late answer to an abandoned
// request from leaking into the next one. timeout bounds the whole
// exchange.
func FetchReplay(ctx context.Context, endpoint string, start uint64, timeout time.Duration, fn func(seq uint64, payload []byte) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sock := zmq4.NewDealer(ctx, zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerMaxRetries(int(timeout/(50*time.Millisecond))))
	defer sock.Close()
	if err := sock.Dial(endpoint); err != nil {
		return fmt.Errorf("replay %s: %w", endpoint, err)
	}
	if err := sock.SendMulti(zmq4.NewMsgFrom(nil, seqBytes(start))); err != nil {
		return fmt.Errorf("replay %s: send request: %w", endpoint, err)
	}
	for {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("replay %s from seq %d: %w", endpoint, start, ctx.Err())
			}
			return fmt.Errorf("replay %s: %w", endpoint, err)
		}
		// [delimiter,] [topic,] seq, payload: the DEALER's empty delimiter,
		// then the topic that vLLM (0.32 at least) puts before the seq as on
		// its PUB socket; older publishers send seq and payload alone.
		f := msg.Frames
		if len(f) >= 3 && len(f[0]) == 0 {
			f = f[1:]
		}
		if len(f) == 3 {
			f = f[1:]
		}
		if len(f) != 2 || len(f[0]) != 8 {
			return fmt.Errorf("replay %s: %w: reply has %d frames", endpoint, errBadReply, len(msg.Frames))
		}
		if bytes.Equal(f[0], endMarker) {
			return nil
		}
		seq, _ := seqOf(f[0])
		if err := fn(seq, f[1]); err != nil {
			return err
		}
	}
}

var errBadReply = errors.New("malformed replay reply")
