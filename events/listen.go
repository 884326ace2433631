package events

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"time"
)

// ListenConfig configures Listen (`kvmesh events listen`).
type ListenConfig struct {
	Endpoint       string
	ReplayEndpoint string
	Topic          string
	BlockSize      int           // for the conversion counters; 0 trusts the wire
	Count          int           // stop after this many events; 0: until timeout or ctx
	Timeout        time.Duration // 0: none
	Logger         *slog.Logger
}

// ErrListenTimeout is returned when the timeout hits before Count events.
var ErrListenTimeout = errors.New("timed out")

// Listen subscribes to a publisher and writes one JSON line per decoded wire
// event to out:
//
//	{"seq":S,"dp_rank":R,"type":"stored|removed|cleared","engine_hashes":[...],
//	 "parent":P|null,"token_ids":[...],"block_size":N,"medium":M|null,"lora_name":L|null}
//
// A store that names a cache salt (see Event.CacheSalt) adds "cache_salt":S
// at the end; a continuation of a salted chain names none on the wire.
//
// Hashes are written as unsigned decimal integers. It returns how many
// events it wrote; with Count > 0 the timeout is an error.
func Listen(ctx context.Context, cfg ListenConfig, out io.Writer) (int, error) {
	if cfg.Count < 0 {
		return 0, fmt.Errorf("count %d < 0", cfg.Count)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.Timeout > 0 {
		var c2 context.CancelFunc
		ctx, c2 = context.WithTimeoutCause(ctx, cfg.Timeout, ErrListenTimeout)
		defer c2()
	}
	w := bufio.NewWriter(out)
	seen := 0
	var line []byte
	var werr error
	sub, err := NewSubscriber(Config{
		Endpoint: cfg.Endpoint, ReplayEndpoint: cfg.ReplayEndpoint, Topic: cfg.Topic,
		BlockSize: cfg.BlockSize, Logger: cfg.Logger,
		Handler: func(d Delivery) {
			if d.Batch == nil || werr != nil {
				return
			}
			for i := range d.Batch.Events {
				if cfg.Count > 0 && seen >= cfg.Count {
					return
				}
				line = AppendJSONLine(line[:0], d.Seq, d.Batch, &d.Batch.Events[i])
				if _, werr = w.Write(line); werr != nil {
					cancel()
					return
				}
				seen++
			}
			// Flush per batch so a pipe reader sees events as they come.
			if werr = w.Flush(); werr != nil || (cfg.Count > 0 && seen >= cfg.Count) {
				cancel()
			}
		},
	})
	if err != nil {
		return 0, err
	}
	if err := sub.Run(ctx); err != nil {
		return seen, err
	}
	if werr == nil {
		werr = w.Flush()
	}
	if werr != nil {
		return seen, fmt.Errorf("write: %w", werr)
	}
	if cfg.Count > 0 && seen < cfg.Count {
		if errors.Is(context.Cause(ctx), ErrListenTimeout) {
			return seen, fmt.Errorf("%w after %v: saw %d of %d events", ErrListenTimeout, cfg.Timeout, seen, cfg.Count)
		}
		return seen, fmt.Errorf("stopped: saw %d of %d events: %w", seen, cfg.Count, context.Cause(ctx))
	}
	return seen, nil
}

// AppendJSONLine appends the listen line of one event. Numbers are written
// by strconv, so u64 hashes never pass through float64.
func AppendJSONLine(dst []byte, seq uint64, b *Batch, ev *Event) []byte {
	dst = append(dst, `{"seq":`...)
	dst = strconv.AppendUint(dst, seq, 10)
	dst = append(dst, `,"dp_rank":`...)
	dst = strconv.AppendInt(dst, b.DPRank, 10)
	dst = append(dst, `,"type":"`...)
	dst = append(dst, ev.Type.String()...)
	dst = append(dst, `","engine_hashes":[`...)
	for i, h := range ev.BlockHashes {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(h), 10)
	}
	dst = append(dst, `],"parent":`...)
	if ev.HasParent {
		dst = strconv.AppendUint(dst, uint64(ev.Parent), 10)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"token_ids":[`...)
	for i, t := range ev.TokenIDs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(t), 10)
	}
	dst = append(dst, `],"block_size":`...)
	dst = strconv.AppendInt(dst, int64(ev.BlockSize), 10)
	dst = append(dst, `,"medium":`...)
	dst = appendOptJSONString(dst, ev.Medium, ev.HasMedium)
	dst = append(dst, `,"lora_name":`...)
	dst = appendOptJSONString(dst, ev.LoRAName, ev.HasLoRAName)
	if ev.Type == TypeStored && ev.CacheSalt != "" {
		dst = append(dst, `,"cache_salt":`...)
		dst = appendOptJSONString(dst, ev.CacheSalt, true)
	}
	return append(dst, "}\n"...)
}

func appendOptJSONString(dst []byte, s string, ok bool) []byte {
	if !ok {
		return append(dst, "null"...)
	}
	q, err := json.Marshal(s)
	if err != nil { // strings always marshal; keep the line valid anyway
		return append(dst, "null"...)
	}
	return append(dst, q...)
}
