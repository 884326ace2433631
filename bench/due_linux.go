package bench

import (
	"errors"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// dueWaiter parks its goroutine until an op's due time. time.Sleep alone
// oversleeps by up to a millisecond whenever every P is idle: the runtime
// then waits for its next timer in epoll_wait, whose timeout is whole
// milliseconds (a 100 µs sleep waits 1 ms), and at 20k offered ops/s a
// finder's next find is ~100 µs away. A timerfd armed for the due time
// wakes that epoll_wait on the µs; the same time as a read deadline wakes
// the goroutine at the next scheduling point when the cores are busy (the
// netpoller is then seldom polled, timers are checked at every switch).
// Whichever comes first ends the wait: no core is held while waiting.
type dueWaiter struct {
	f   *os.File // the timerfd, non-blocking so the netpoller watches it
	fd  int      // its descriptor (File.Fd would make it blocking)
	buf [8]byte
}

func newDueWaiter() *dueWaiter {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return &dueWaiter{} // waits with sleepUntil
	}
	return &dueWaiter{f: os.NewFile(uintptr(fd), "timerfd"), fd: fd}
}

func (w *dueWaiter) close() {
	if w.f != nil {
		w.f.Close()
	}
}

// wait returns at t or as soon after as the machine lets it.
func (w *dueWaiter) wait(t time.Time) {
	for {
		d := time.Until(t)
		switch {
		case d <= 0:
			return
		case d < spinUnder:
			runtime.Gosched()
		case w.f == nil:
			sleepUntil(t)
			return
		default:
			// Relative: time.Time's monotonic reading is not
			// CLOCK_MONOTONIC's origin. Re-arming clears an expiry the
			// deadline beat last time, and the loop absorbs the
			// netpoller's stale readiness from it.
			spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
			if unix.TimerfdSettime(w.fd, 0, &spec, nil) != nil {
				time.Sleep(d)
				continue
			}
			w.f.SetReadDeadline(t)
			// The expiry count, or the deadline's error; any other
			// error leaves the timerfd for good rather than loop on it.
			if _, err := w.f.Read(w.buf[:]); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				w.close()
				w.f = nil
			}
		}
	}
}
