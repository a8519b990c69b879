package modeltest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/countlimit/countlimit/countlimit/driver"
	"github.com/countlimit/countlimit/internal/store/keystate"
	"github.com/countlimit/countlimit/internal/testkit/model"
)

// EnvCover names the environment variable that asks Run to write, into
// the directory it names, how often each case of each path's statements
// (Path.Cases) was reached: one file per test process, cases-<pid>.tsv,
// a line "copy<TAB>case<TAB>count" for every case of Path.AllCases, 0
// for one never reached. internal/testkit/coverreport reads them.
const EnvCover = "COUNTLIMIT_MODEL_COVER"

// Tally counts the steps that reached each case, by name ("copy: case").
type Tally map[string]int

// writeTally appends p's tally to the file EnvCover asks for, if any,
// and fails t for a case that p.AllCases does not list.
func writeTally(t *testing.T, p Path, tally Tally) {
	t.Helper()
	for c := range tally {
		if !slices.Contains(p.AllCases, c) {
			t.Errorf("path %s reached case %q, which its AllCases does not list", p.Name, c)
		}
	}
	dir := os.Getenv(EnvCover)
	if dir == "" || p.Cases == nil {
		return
	}
	var b strings.Builder
	for _, c := range p.AllCases {
		stmt, arm, ok := strings.Cut(c, ": ")
		if !ok {
			t.Fatalf("path %s: case %q is not \"copy: case\"", p.Name, c)
		}
		fmt.Fprintf(&b, "%s\t%s\t%d\n", stmt, arm, tally[c])
	}
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("cases-%d.tsv", os.Getpid())), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString(b.String())
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// The arms of the decision of one count check (an allow, peek or refund
// that is not on leases), as every copy spells them out: what the key
// holds, its penalty, and, for an allow of a window (not sliding, not
// smooth), the verdict.
const (
	ArmNew            = "new key"
	ArmNoWindow       = "no window (a denial of a new key left it empty)"
	ArmLifetime       = "a lifetime window"
	ArmCurrent        = "a window that ends later"
	ArmEndsNow        = "a window that ends exactly now"
	ArmOver           = "a window that is over"
	ArmLog            = "a sliding log"
	ArmSmooth         = "a smooth instant"
	ArmBlocked        = "in the penalty box"
	ArmBlockEndsNow   = "a penalty that ends exactly now"
	ArmBlockOver      = "a penalty that is over"
	ArmAllowedIn      = "allowed in the current window"
	ArmAllowedNew     = "allowed, a window opened"
	ArmAllowedFull    = "allowed up to the limit"
	ArmOtherDenied    = "fits, another rule denied"
	ArmDeniedBlocked  = "denied again in the penalty box, the rule has a penalty"
	ArmDeniedBlocked0 = "denied again in the penalty box, the rule has none"
	ArmDeniedSet      = "denied, a penalty set"
	ArmDeniedNoBlock  = "denied, the rule has no penalty"
	ArmEndsNowAllowed = "allowed at a penalty's end"
	ArmEndsNowDenied  = "denied at a penalty's end"
	ArmDeniedOver     = "denied outside a current window (a fresh one reported)"
	ArmOverLimit      = "n over the limit"
)

// WindowArms are every name Arms gives an allow of one check of a
// window (not sliding, not smooth), on a key of any form: what the fast
// path's statements decide.
var WindowArms = []string{
	ArmNew, ArmNoWindow, ArmLifetime, ArmCurrent, ArmEndsNow, ArmOver, ArmLog, ArmSmooth,
	ArmBlocked, ArmBlockEndsNow, ArmBlockOver,
	ArmAllowedIn, ArmAllowedNew, ArmAllowedFull,
	ArmDeniedBlocked, ArmDeniedBlocked0, ArmDeniedSet, ArmDeniedNoBlock,
	ArmEndsNowAllowed, ArmEndsNowDenied, ArmDeniedOver, ArmOverLimit,
}

// AllArms are every name Arms gives: WindowArms, and a check that fits
// beside another rule's denial.
var AllArms = append(slices.Clone(WindowArms), ArmOtherDenied)

// Arms names the arms of the decision check c of r takes on its key k
// (its state just before r), as a statement that decides it spells them
// out: the key's window (new, empty, current, ending exactly now, over; a
// sliding log or a smooth instant) and its penalty (running, ending
// exactly now, over); for an allow of a window (not sliding, not smooth),
// the verdict (allowed in the window or in a new one, up to the limit;
// fitting beside another rule's denial; denied again in the penalty box
// by a rule with a penalty or without, setting a penalty, or with none to
// set; at a penalty's end; outside a current window; n over the limit).
// c.State is the check's answer, as the path gave it.
func Arms(k model.Key, r *driver.Request, c *driver.Check) []string {
	now := r.Now.UnixMicro()
	var out []string
	window := k.Begin < k.End
	cur := window && now < k.End
	switch {
	case keystate.Empty(&k):
		out = append(out, ArmNew)
	case len(k.Log) > 0:
		out = append(out, ArmLog)
	case k.TAT > 0:
		out = append(out, ArmSmooth)
	case !window:
		out = append(out, ArmNoWindow)
	case k.End == model.Forever:
		out = append(out, ArmLifetime)
	case k.End > now:
		out = append(out, ArmCurrent)
	case k.End == now:
		out = append(out, ArmEndsNow)
	default:
		out = append(out, ArmOver)
	}
	blocked := k.Blocked > now
	switch {
	case blocked:
		out = append(out, ArmBlocked)
	case k.Blocked == now:
		out = append(out, ArmBlockEndsNow)
	case k.Blocked != 0:
		out = append(out, ArmBlockOver)
	}
	if r.Op != driver.OpAllow || c.Span > 0 || c.Smooth() || c.TTL > 0 {
		return out
	}
	used := int64(0)
	if cur {
		used = k.Count
	}
	fits := !blocked && r.N <= c.Limit-used
	allowed := c.State.Allowed
	switch {
	case fits && !allowed:
		out = append(out, ArmOtherDenied)
	case fits && cur:
		out = append(out, ArmAllowedIn)
	case fits:
		out = append(out, ArmAllowedNew)
	case blocked && c.Block > 0:
		out = append(out, ArmDeniedBlocked)
	case blocked:
		out = append(out, ArmDeniedBlocked0)
	case c.Block > 0:
		out = append(out, ArmDeniedSet)
	default:
		out = append(out, ArmDeniedNoBlock)
	}
	if k.Blocked == now {
		if fits {
			out = append(out, ArmEndsNowAllowed)
		} else {
			out = append(out, ArmEndsNowDenied)
		}
	}
	if !fits && !cur {
		out = append(out, ArmDeniedOver)
	}
	if r.N > c.Limit {
		out = append(out, ArmOverLimit)
	}
	if allowed && used+r.N == c.Limit {
		out = append(out, ArmAllowedFull)
	}
	return out
}
