package bench

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/countlimit/countlimit/internal/service/clikit"
)

// The chart bench --plot draws: one column per number of ids (and, for
// bench --baseline, per kind of rows and run of random ids), calls/s
// (linear) above p50 and p99 latency (log), both against callers on a log
// scale, one colour per kind of call. Written by hand: a few dozen SVG
// elements need no plotting library.
const (
	plotLeft    = 84  // room for the first column's y labels and title
	plotGapX    = 100 // between columns: the next column's y labels
	plotRight   = 30
	plotTop     = 138.0 // title, subtitle, legend and column titles
	plotGapY    = 62    // between rows: the upper row's x labels
	plotBottom  = 64    // x labels and the x title
	plotPanelH  = 240
	plotFont    = `font-family="Helvetica, Arial, sans-serif"`
	plotInk     = "#222"
	plotMuted   = "#666"
	plotGrid    = "#e6e6e6"
	plotMinor   = "#f3f3f3"
	plotAxis    = "#888"
	plotDash    = "7 4"
	plotPointR  = 3.6
	plotLineW   = 2.2
	plotLabelSz = 12
)

// plotCall is how a kind of call is drawn and named.
var plotCall = map[string]struct{ label, color string }{
	"upsert":    {"hand-written upsert", "#e66101"},
	"allow":     {"Allow", "#1f5fa8"},
	"allow_all": {"AllowAll", "#1f5fa8"},
	// bench --baseline --check lease: one pair a call.
	"acquire_release": {"Acquire + Release", "#1f5fa8"},
}

// writePlot draws r's runs as an SVG chart.
func writePlot(w io.Writer, r benchReport) error {
	var xs []int
	var cols []plotColumn
	var calls []string
	for _, run := range r.Runs {
		if !slices.Contains(xs, run.Callers) {
			xs = append(xs, run.Callers)
		}
		if c := columnOf(run); !slices.Contains(cols, c) {
			cols = append(cols, c)
		}
		if !slices.Contains(calls, run.Call) {
			calls = append(calls, run.Call)
		}
	}
	slices.Sort(xs)
	if len(xs) == 0 {
		return fmt.Errorf("nothing was measured")
	}
	panelW := 400.0
	if len(cols) == 1 {
		panelW = 560
	}
	width := plotLeft + float64(len(cols))*panelW + float64(len(cols)-1)*plotGapX + plotRight
	title, subtitle := plotTitles(r)
	// The line under the title wraps between its parts where the chart is
	// too narrow for it; the rest moves down.
	var sub []string
	for _, part := range subtitle {
		if n := len(sub); n > 0 && textWidth(sub[n-1]+" · "+part, 13) < width-2*(plotLeft-60) {
			sub[n-1] += " · " + part
		} else {
			sub = append(sub, part)
		}
	}
	shift := 18 * float64(len(sub)-1)
	top := plotTop + shift
	height := top + 2*plotPanelH + plotGapY + plotBottom
	// runsOf returns the runs of one call in one column, by callers.
	runsOf := func(col plotColumn, call string) []benchRun {
		var out []benchRun
		for _, run := range r.Runs {
			if columnOf(run) == col && run.Call == call {
				out = append(out, run)
			}
		}
		slices.SortFunc(out, func(a, b benchRun) int { return a.Callers - b.Callers })
		return out
	}
	// One y scale per row, shared by the columns, so they compare at a glance.
	var rates, lats []float64
	for _, run := range r.Runs {
		rates = append(rates, run.CallsPerSecond)
		lats = append(lats, run.P50Seconds, run.P99Seconds)
	}
	rateAxis := linearAxis(slices.Max(rates))
	latAxis := logAxis(lats)

	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" %s>`+"\n", width, height, width, height, plotFont)
	p(`<rect width="100%%" height="100%%" fill="#fff"/>` + "\n")

	p(`<text x="%d" y="34" font-size="20" font-weight="bold" fill="%s">%s</text>`+"\n", plotLeft-60, plotInk, esc(title))
	for i, line := range sub {
		p(`<text x="%d" y="%d" font-size="13" fill="%s">%s</text>`+"\n", plotLeft-60, 58+18*i, plotMuted, esc(line))
	}

	// The legend: one entry per kind of call, then the two line styles.
	lx := float64(plotLeft - 60)
	ly := 88 + shift
	for _, call := range calls {
		label, color := plotStyle(call)
		p(`<g class="legend" data-call="%s">`, esc(call))
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"/>`, lx, ly, lx+26, ly, color, plotLineW)
		p(`<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s"/>`, lx+13, ly, plotPointR, color)
		p(`<text x="%.1f" y="%.1f" font-size="13" fill="%s">%s</text></g>`+"\n", lx+34, ly+4.5, plotInk, esc(label))
		lx += 34 + textWidth(label, 13) + 28
	}
	for _, s := range []struct{ label, dash, fill string }{{"p50", "", plotMuted}, {"p99", plotDash, "#fff"}} {
		p(`<g class="legend" data-line="%s">`, s.label)
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="%.1f"%s/>`, lx, ly, lx+26, ly, plotMuted, plotLineW, dashAttr(s.dash))
		p(`<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s" stroke="%s" stroke-width="1.6"/>`, lx+13, ly, plotPointR, s.fill, plotMuted)
		p(`<text x="%.1f" y="%.1f" font-size="13" fill="%s">%s latency</text></g>`+"\n", lx+34, ly+4.5, plotInk, s.label)
		lx += 34 + textWidth(s.label+" latency", 13) + 28
	}
	if slices.Contains(calls, "upsert") && slices.Contains(calls, "allow") {
		p(`<g class="legend" data-line="ratio"><text x="%.1f" y="%.1f" font-size="12" font-weight="bold" fill="%s">n×</text>`, lx, ly+4.5, plotCall["allow"].color)
		p(`<text x="%.1f" y="%.1f" font-size="13" fill="%s">Allow's calls/s ÷ the upsert's</text></g>`+"\n", lx+25, ly+4.5, plotInk)
	}

	for ci, col := range cols {
		ids := col.ids
		x0 := plotLeft + float64(ci)*(panelW+plotGapX)
		colTitle := "over " + clikit.Plural(ids, "id", "ids")
		switch {
		case ids == 0:
			colTitle = "over new ids"
		case ids == 1:
			colTitle = "on 1 id (every call on one hot counter)"
		case col.rows == rowsRandom:
			colTitle = fmt.Sprintf("over %s at random, run %d", clikit.Plural(ids, "id", "ids"), col.run)
		}
		if len(cols) > 1 || ids > 1 {
			p(`<text x="%.1f" y="%.1f" font-size="15" font-weight="bold" fill="%s">%s</text>`+"\n", x0, top-18, plotInk, esc(thousands(colTitle)))
		}
		xAt := func(callers int) float64 {
			lo, hi := math.Log2(float64(xs[0])), math.Log2(float64(xs[len(xs)-1]))
			if hi == lo {
				return x0 + panelW/2
			}
			pad := panelW * 0.07
			return x0 + pad + (math.Log2(float64(callers))-lo)/(hi-lo)*(panelW-2*pad)
		}
		for row, ax := range []axis{rateAxis, latAxis} {
			y0 := top + float64(row*(plotPanelH+plotGapY))
			yAt := func(v float64) float64 { return y0 + plotPanelH - ax.pos(v)*plotPanelH }
			p(`<g class="panel" data-ids="%d"%s data-metric="%s">`+"\n", ids, col.attrs(), []string{"calls_per_second", "latency_seconds"}[row])
			for _, t := range ax.minor {
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x0, yAt(t), x0+panelW, yAt(t), plotMinor)
			}
			for _, t := range ax.ticks {
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", x0, yAt(t), x0+panelW, yAt(t), plotGrid)
				p(`<text x="%.1f" y="%.1f" font-size="%d" fill="%s" text-anchor="end">%s</text>`+"\n", x0-8, yAt(t)+4, plotLabelSz, plotMuted, esc(ax.label(t)))
			}
			for _, c := range xs {
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", xAt(c), y0, xAt(c), y0+plotPanelH, plotGrid)
				p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n", xAt(c), y0+plotPanelH, xAt(c), y0+plotPanelH+5, plotAxis)
				p(`<text x="%.1f" y="%.1f" font-size="%d" fill="%s" text-anchor="middle">%d</text>`+"\n", xAt(c), y0+plotPanelH+19, plotLabelSz, plotMuted, c)
			}
			p(`<path d="M%.1f %.1fV%.1fH%.1f" fill="none" stroke="%s"/>`+"\n", x0, y0, y0+plotPanelH, x0+panelW, plotAxis)
			if ci == 0 {
				yTitle := []string{"calls/s", "latency (log scale)"}[row]
				p(`<text transform="translate(%.1f %.1f) rotate(-90)" font-size="13" fill="%s" text-anchor="middle">%s</text>`+"\n",
					float64(plotLeft-62), y0+plotPanelH/2, plotInk, yTitle)
			}
			if row == 1 {
				p(`<text x="%.1f" y="%.1f" font-size="13" fill="%s" text-anchor="middle">concurrent callers (log scale)</text>`+"\n",
					x0+panelW/2, y0+plotPanelH+44, plotInk)
			}
			type line struct {
				name  string
				value func(benchRun) float64
				dash  string
				fill  bool
			}
			lines := []line{{"calls/s", func(r benchRun) float64 { return r.CallsPerSecond }, "", true}}
			if row == 1 {
				lines = []line{
					{"p50", func(r benchRun) float64 { return r.P50Seconds }, "", true},
					{"p99", func(r benchRun) float64 { return r.P99Seconds }, plotDash, false},
				}
			}
			for _, call := range calls {
				label, color := plotStyle(call)
				runs := runsOf(col, call)
				for _, ln := range lines {
					p(`<g class="series" data-call="%s" data-ids="%d"%s data-value="%s">`+"\n", esc(call), ids, col.attrs(), ln.name)
					var pts []string
					for _, run := range runs {
						if v := ln.value(run); ax.log && v <= 0 {
							continue // no place on a log scale
						}
						pts = append(pts, fmt.Sprintf("%.1f,%.1f", xAt(run.Callers), yAt(ln.value(run))))
					}
					if len(pts) > 1 {
						p(`<polyline points="%s" fill="none" stroke="%s" stroke-width="%.1f" stroke-linejoin="round"%s/>`+"\n",
							strings.Join(pts, " "), color, plotLineW, dashAttr(ln.dash))
					}
					for _, run := range runs {
						v := ln.value(run)
						if ax.log && v <= 0 {
							continue
						}
						fill := color
						if !ln.fill {
							fill = "#fff"
						}
						p(`<circle cx="%.1f" cy="%.1f" r="%.1f" fill="%s" stroke="%s" stroke-width="1.6"><title>%s, %s, %s: %s %s</title></circle>`+"\n",
							xAt(run.Callers), yAt(v), plotPointR, fill, color, esc(label), clikit.Plural(run.Callers, "caller", "callers"),
							thousands(clikit.Plural(run.IDs, "id", "ids")), esc(ax.value(v)), ln.name)
					}
					p("</g>\n")
				}
			}
			// Allow's throughput as a multiple of the upsert's, next to the
			// higher of the two points, where it crosses no line.
			if row == 0 {
				var ours []benchRun
				for _, call := range calls {
					if call != "upsert" {
						ours = runsOf(col, call)
						break
					}
				}
				base := runsOf(col, "upsert")
				var lines [][]point
				for _, side := range [][]benchRun{base, ours} {
					var pts []point
					for _, run := range side {
						pts = append(pts, point{xAt(run.Callers), yAt(run.CallsPerSecond)})
					}
					lines = append(lines, pts)
				}
				for i := range min(len(base), len(ours)) {
					if base[i].Callers != ours[i].Callers || base[i].CallsPerSecond <= 0 {
						continue
					}
					text := ratioText(ours[i].CallsPerSecond/base[i].CallsPerSecond) + "×"
					at := point{xAt(ours[i].Callers), yAt(math.Max(base[i].CallsPerSecond, ours[i].CallsPerSecond))}
					x, y, anchor := placeLabel(text, at, lines, x0, x0+panelW, y0)
					p(`<text class="ratio" x="%.1f" y="%.1f" font-size="12" font-weight="bold" fill="%s" text-anchor="%s">%s</text>`+"\n",
						x, y, plotCall["allow"].color, anchor, text)
				}
			}
			p("</g>\n")
		}
	}
	p("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// plotColumn is what a column of the chart shows: the runs over one number
// of ids, of one kind of rows (bench --baseline's --rows) and one run of it.
type plotColumn struct {
	ids  int
	rows string
	run  int
}

func columnOf(r benchRun) plotColumn { return plotColumn{r.IDs, r.Rows, r.Run} }

// attrs names the column's run of random ids in the SVG, for machines.
func (c plotColumn) attrs() string {
	if c.run == 0 {
		return ""
	}
	return fmt.Sprintf(` data-rows="%s" data-run="%d"`, esc(c.rows), c.run)
}

type point struct{ x, y float64 }

// placeLabel places a 12px label by the point at: above it, to its left or
// right, or below, whichever crosses the fewest of lines and stays between
// left and right and below top. It returns the text's x, baseline y and
// anchor.
func placeLabel(text string, at point, lines [][]point, left, right, top float64) (float64, float64, string) {
	w, h := textWidth(text, 12), 12.0
	type spot struct {
		dx, dy float64 // from at to the text's anchor point and baseline
		anchor string
	}
	best, bestHits := spot{0, -10, "middle"}, math.MaxInt
	for _, s := range []spot{{-7, -8, "end"}, {7, -8, "start"}, {0, -11, "middle"}, {7, 16, "start"}, {-7, 16, "end"}, {0, 20, "middle"}} {
		x0 := at.x + s.dx
		switch s.anchor {
		case "end":
			x0 -= w
		case "middle":
			x0 -= w / 2
		}
		y0 := at.y + s.dy - h
		hits := 0
		if x0 < left || x0+w > right || y0 < top {
			hits += 100
		}
		for _, ln := range lines {
			for i := 1; i < len(ln); i++ {
				for k := 0; k <= 40; k++ {
					t := float64(k) / 40
					x, y := ln[i-1].x+t*(ln[i].x-ln[i-1].x), ln[i-1].y+t*(ln[i].y-ln[i-1].y)
					if x >= x0-2 && x <= x0+w+2 && y >= y0-2 && y <= y0+h+3 {
						hits++
					}
				}
			}
		}
		if hits < bestHits {
			best, bestHits = s, hits
		}
	}
	return at.x + best.dx, at.y + best.dy, best.anchor
}

// plotTitles returns the chart's title and the parts of the line under it.
func plotTitles(r benchReport) (string, []string) {
	parts := []string{r.Store}
	title := "countlimit bench"
	if r.Mode == "bench --baseline" {
		title = "Allow against a hand-written upsert, on PostgreSQL"
		if i := slices.IndexFunc(baselineChecks, func(c baselineCheck) bool { return len(r.Checks) == 1 && c.name == r.Checks[0] }); i >= 0 {
			title = baselineChecks[i].what + ", against a hand-written upsert, on PostgreSQL"
		}
		if r.SynchronousCommit != "" {
			parts = append(parts, "synchronous_commit="+r.SynchronousCommit)
		}
		parts = append(parts, fmt.Sprintf("%gs per cell each way, in rounds of upsert, Allow, Allow, upsert", r.RunSeconds))
	} else {
		rule := "a fixed 1m window no call fills"
		if r.Rule != "" {
			rule = r.Rule
			if r.Tier != "" {
				rule += " (tier " + r.Tier + ")"
			}
		}
		title += ": " + rule
		parts = append(parts, fmt.Sprintf("%gs per run", r.RunSeconds))
	}
	if !r.Started.IsZero() {
		parts = append(parts, r.Started.UTC().Format(time.DateOnly+" 15:04")+" UTC")
	}
	return title, parts
}

func plotStyle(call string) (label, color string) {
	if s, ok := plotCall[call]; ok {
		return s.label, s.color
	}
	return call, "#555"
}

func dashAttr(dash string) string {
	if dash == "" {
		return ""
	}
	return ` stroke-dasharray="` + dash + `"`
}

func ratioText(r float64) string {
	if r >= 10 {
		return strconv.FormatFloat(r, 'f', 0, 64)
	}
	return strconv.FormatFloat(r, 'f', 1, 64)
}

// axis maps values to 0..1 along a panel's height, with the values to mark.
type axis struct {
	log          bool
	lo, hi       float64
	ticks, minor []float64
	label, value func(float64) string // a tick's label; a point's value
}

func (a axis) pos(v float64) float64 {
	if a.log {
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// linearAxis is a calls/s axis from 0 to a round number above max, with
// four to six round ticks.
func linearAxis(max float64) axis {
	if max <= 0 {
		max = 1
	}
	raw := max / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	top := math.Ceil(max*1.08/step) * step
	a := axis{lo: 0, hi: top, label: rateTick, value: func(v float64) string { return thousands(strconv.FormatFloat(v, 'f', 0, 64)) }}
	for i := 0.0; i*step <= top+step/2; i++ {
		a.ticks = append(a.ticks, i*step)
	}
	return a
}

// logAxis is a latency axis (seconds) from the 1-2-5 step below the least
// value to the one above the greatest; it labels every step over up to two
// and a half decades (with 3 and 4 too over less than one), else the
// decades only.
func logAxis(values []float64) axis {
	lo, hi := math.Inf(1), 0.0
	for _, v := range values {
		if v > 0 {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if hi == 0 {
		lo, hi = 1e-3, 1e-3
	}
	a := logAxisSteps(lo, hi, []float64{1, 2, 5})
	if math.Log10(a.hi/a.lo) < 1 {
		a = logAxisSteps(lo, hi, []float64{1, 2, 3, 4, 5, 7})
	}
	return a
}

func logAxisSteps(lo, hi float64, mults []float64) axis {
	var steps []float64
	for e := math.Floor(math.Log10(lo)) - 1; e <= math.Ceil(math.Log10(hi))+1; e++ {
		for _, m := range mults {
			steps = append(steps, roundTo(m*math.Pow(10, e), 3))
		}
	}
	a := axis{log: true, lo: steps[0], hi: steps[len(steps)-1], label: latencyTick, value: func(v float64) string { return latency(v) }}
	for _, s := range steps {
		if s <= lo/1.15 {
			a.lo = s
		}
	}
	for i := len(steps) - 1; i >= 0; i-- {
		if steps[i] >= hi*1.15 {
			a.hi = steps[i]
		}
	}
	decadesOnly := math.Log10(a.hi/a.lo) > 2.5
	for _, s := range steps {
		if s < a.lo*0.999 || s > a.hi*1.001 {
			continue
		}
		m := s / math.Pow(10, math.Floor(math.Log10(s)+1e-9))
		if decadesOnly && math.Abs(m-1) > 1e-6 {
			a.minor = append(a.minor, s)
			continue
		}
		a.ticks = append(a.ticks, s)
	}
	return a
}

// rateTick labels a calls/s tick: 0, 500, 2.5k, 20k, 1.5M.
func rateTick(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'g', 4, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'g', 4, 64) + "k"
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// latencyTick labels a latency tick (seconds): 200ns, 50µs, 1ms, 2s.
func latencyTick(s float64) string {
	for _, u := range []struct {
		name string
		size float64
	}{{"s", 1}, {"ms", 1e-3}, {"µs", 1e-6}} {
		if s >= u.size*0.9999 {
			return strconv.FormatFloat(roundTo(s/u.size, 3), 'g', -1, 64) + u.name
		}
	}
	return strconv.FormatFloat(roundTo(s*1e9, 3), 'g', -1, 64) + "ns"
}

// roundTo rounds v to n significant digits, so that 0.1+0.2 labels as 0.3.
func roundTo(v float64, n int) float64 {
	f, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', n, 64), 64)
	return f
}

// thousands puts a space between the thousands of every run of five or
// more digits in s: "10000 ids" becomes "10 000 ids".
func thousands(s string) string {
	var out strings.Builder
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i {
			out.WriteByte(s[i])
			i++
			continue
		}
		digits := s[i:j]
		if len(digits) >= 5 && (i == 0 || s[i-1] != '.') {
			for k, d := range digits {
				if k > 0 && (len(digits)-k)%3 == 0 {
					out.WriteByte(' ')
				}
				out.WriteRune(d)
			}
		} else {
			out.WriteString(digits)
		}
		i = j
	}
	return out.String()
}

// textWidth estimates how wide text is drawn at size px in a sans-serif
// face, enough to lay the legend out without measuring fonts.
func textWidth(text string, size float64) float64 {
	return float64(len([]rune(text))) * size * 0.56
}

var xmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&apos;")

func esc(s string) string { return xmlEscaper.Replace(s) }
