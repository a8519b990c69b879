package wire_test

import (
	"testing"
	"time"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/wire"
)

func TestWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 5, 11, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name       string
		c          driver.Check
		wantBegin  time.Time
		wantLength int64
	}{
		{"rolling", driver.Check{Begin: t0, End: t0.Add(10 * time.Second)}, t0, 10e6},
		{"lifetime", driver.Check{Begin: t0}, t0, 0},
		{"sliding", driver.Check{Span: time.Minute}, time.Time{}, 0},
		{"sliding with made-up bounds", driver.Check{Begin: t0.Add(-time.Minute), End: t0.Add(time.Minute), Span: time.Minute}, time.Time{}, 0},
	} {
		begin, length := wire.Window(&tc.c)
		if !begin.Equal(tc.wantBegin) || length != tc.wantLength {
			t.Errorf("%s: Window = %v, %d; want %v, %d", tc.name, begin, length, tc.wantBegin, tc.wantLength)
		}
	}
}

func TestMicrosAndTime(t *testing.T) {
	t.Parallel()
	const none = -1 << 53
	t0 := time.Date(2026, 5, 11, 9, 0, 0, 123456000, time.UTC)
	for _, tm := range []time.Time{{}, t0, time.UnixMicro(0)} {
		us := wire.Micros(tm, none)
		if got := wire.Time(us, none); !got.Equal(tm) {
			t.Errorf("Time(Micros(%v)) = %v", tm, got)
		}
	}
	if us := wire.Micros(time.Time{}, none); us != none {
		t.Errorf("Micros(zero Time) = %d, want none (%d)", us, int64(none))
	}
}
