package frontend

import "strings"

// stopStrings holds back just enough streamed text to recognise a stop
// string that spans pieces. The detokenizer only hands it whole UTF-8
// characters, and a held-back suffix equals the start of a (valid UTF-8)
// stop string, so a cut never splits a character.
type stopStrings struct {
	stops   []string
	pending string
}

func newStopMatcher(stops []string) stopMatcher {
	if len(stops) == 0 {
		return nil
	}
	return &stopStrings{stops: stops}
}

func (s *stopStrings) Push(text string) (string, bool) {
	buf := s.pending + text
	first := -1
	for _, st := range s.stops {
		if i := strings.Index(buf, st); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		s.pending = ""
		return buf[:first], true
	}
	keep := 0
	for _, st := range s.stops {
		for n := min(len(st)-1, len(buf)); n > keep; n-- {
			if strings.HasSuffix(buf, st[:n]) {
				keep = n
				break
			}
		}
	}
	s.pending = buf[len(buf)-keep:]
	return buf[:len(buf)-keep], false
}

func (s *stopStrings) Flush() string {
	p := s.pending
	s.pending = ""
	return p
}
