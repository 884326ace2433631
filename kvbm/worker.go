package kvbm

import "errors"

// Worker is the model side of the connector (vLLM's worker half, and
// TensorRT-LLM's KvCacheConnectorWorker): it runs the ops of each step's
// metadata against the engine's device and the manager's tiers.
type Worker struct {
	c       *Connector
	dev     Device
	stashed []Op // this step's stores, waiting for the forward pass
	ready   []Op // stores whose blocks the forward pass completed
}

// Worker returns the worker half over dev.
func (c *Connector) Worker(dev Device) *Worker { return &Worker{c: c, dev: dev} }

// BindConnectorMetadata takes one step's metadata before its forward pass:
// loads run now (the engine schedules the request only once GetFinished
// reports it received), stores wait for WaitForSave.
func (w *Worker) BindConnectorMetadata(md *Metadata) error {
	var errs []error
	for i := range md.Ops {
		op := &md.Ops[i]
		switch op.Kind {
		case OpLoad:
			n, err := w.c.m.Onboard(w.dev, op.Load, op.Into)
			var ce *CorruptError
			if err != nil && !errors.As(err, &ce) {
				errs = append(errs, err)
			}
			w.c.opDone(op, n)
		case OpStore:
			w.stashed = append(w.stashed, *op)
		}
	}
	return errors.Join(errs...)
}

// WaitForSave marks the forward pass done: the bound stores' device
// blocks now hold their KV and may be copied out.
func (w *Worker) WaitForSave() {
	w.ready = append(w.ready, w.stashed...)
	w.stashed = w.stashed[:0]
}

// GetFinished runs the stores the forward pass released and returns the
// requests finished sending (finished requests whose ops are all done:
// the engine may free their blocks now) and finished receiving (their
// loads are done: the engine may schedule them). A store that fails leaves
// the block uncached; the error is returned after every op has run.
func (w *Worker) GetFinished() (sending, recving []string, err error) {
	var errs []error
	for i := range w.ready {
		op := &w.ready[i]
		if _, err := w.c.m.Offload(w.dev, op.Store); err != nil {
			errs = append(errs, err)
		}
		w.c.opDone(op, 0)
	}
	clear(w.ready)
	w.ready = w.ready[:0]
	sending, recving = w.c.doneSending, w.c.doneRecving
	w.c.doneSending, w.c.doneRecving = nil, nil
	return sending, recving, errors.Join(errs...)
}

// BlockIDsWithLoadErrors returns (and forgets) the device blocks whose load
// failed, a corrupt block and every block after it in its load: the engine
// recomputes them (vLLM's get_block_ids_with_load_errors).
func (w *Worker) BlockIDsWithLoadErrors() []DeviceBlockID {
	ids := w.c.loadErrors
	w.c.loadErrors = nil
	return ids
}
