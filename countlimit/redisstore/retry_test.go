package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countlimit/countlimit/countlimit"
	"github.com/countlimit/countlimit/countlimit/redisstore"
	"github.com/countlimit/countlimit/countlimit/storetest"
)

// dropProxy relays TCP between go-redis and Redis. Armed, it forwards the
// next request that holds its marker, lets Redis run it, and then closes the
// client's connection instead of relaying the reply: the lost reply of a
// connection killed mid-call, which go-redis retries on a new connection.
type dropProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	marker  []byte // nil when not armed
	between func()
	dropped int
}

func newDropProxy(t *testing.T, target string) *dropProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln, target: target}
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.relay(c) })
		}
	})
	return p
}

func (p *dropProxy) addr() string { return p.ln.Addr().String() }

// arm makes the proxy lose the reply to the next request holding marker;
// between, if not nil, runs after Redis answered and before the drop.
func (p *dropProxy) arm(marker string, between func()) {
	p.mu.Lock()
	p.marker, p.between = []byte(marker), between
	p.mu.Unlock()
}

func (p *dropProxy) drops() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

func (p *dropProxy) relay(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer server.Close()
	doomed := make(chan func(), 1)
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				p.mu.Lock()
				if p.marker != nil && bytes.Contains(buf[:n], p.marker) {
					// Doom the reply before Redis can send it.
					doomed <- p.between
					p.marker, p.between = nil, nil
				}
				p.mu.Unlock()
				if _, err := server.Write(buf[:n]); err != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		server.Close()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			select {
			case between := <-doomed:
				if between != nil {
					between()
				}
				p.mu.Lock()
				p.dropped++
				p.mu.Unlock()
				return
			default:
			}
			if _, err := client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestRetryAfterLostReplyCountsOnce loses the reply of each write after
// Redis ran its script. go-redis retries on a new connection (3 retries by
// default); the retry must return the first run's result, not run again.
func TestRetryAfterLostReplyCountsOnce(t *testing.T) {
	t.Parallel()
	direct := client(t)
	proxy := newDropProxy(t, direct.Options().Addr)
	opts := *direct.Options()
	opts.Addr = proxy.addr()
	opts.PoolSize = 1 // the dropped connection is the one the retry replaces
	viaProxy := redis.NewClient(&opts)
	t.Cleanup(func() { viaProxy.Close() })

	ctx := context.Background()
	l := countlimit.New(redisstore.New(viaProxy, guarded()...))
	other := countlimit.New(redisstore.New(direct))
	fixed := countlimit.Rule{UseType: storetest.UseType(t, "retry.fixed"), Limit: 5, Window: countlimit.Fixed(time.Hour)}
	sliding := countlimit.Rule{UseType: storetest.UseType(t, "retry.sliding"), Limit: 5, Window: countlimit.Sliding(time.Hour)}
	// Load the scripts and open the pooled connection, so that the armed
	// request is one EVALSHA on an established connection.
	if _, err := l.AllowAll(ctx, "warm", fixed, sliding); err != nil {
		t.Fatal(err)
	}
	// samePeek checks the whole of a remembered reply, times included,
	// against a Peek made after it.
	samePeek := func(t *testing.T, r countlimit.Result, rule countlimit.Rule, id string) {
		t.Helper()
		p, err := other.Peek(ctx, rule, id)
		if err != nil {
			t.Fatal(err)
		}
		if r != p {
			t.Errorf("result after a lost reply = %+v, want %+v as a Peek reports", r, p)
		}
	}
	used := func(res ...countlimit.Result) []int64 {
		var u []int64
		for _, r := range res {
			u = append(u, r.Used)
		}
		return u
	}

	for _, tc := range []struct {
		name    string
		before  int  // AllowAll(fixed, sliding) calls made first, directly
		between bool // another caller counts fixed between the lost reply and the retry
		call    func(t *testing.T, id string) ([]int64, error)
		want    []int64 // the Used values the call reports
		fixed   int64   // stored count afterwards
		sliding int64   // stored sliding events afterwards
	}{
		{name: "Allow", call: func(t *testing.T, id string) ([]int64, error) {
			r, err := l.Allow(ctx, fixed, id)
			samePeek(t, r, fixed, id)
			return used(r), err
		}, want: []int64{1}, fixed: 1, sliding: 0},
		{name: "AllowN sliding", before: 1, call: func(t *testing.T, id string) ([]int64, error) {
			r, err := l.AllowN(ctx, sliding, id, 2)
			samePeek(t, r, sliding, id)
			return used(r), err
		}, want: []int64{3}, fixed: 1, sliding: 3},
		{name: "AllowAll", before: 1, call: func(t *testing.T, id string) ([]int64, error) {
			res, err := l.AllowAll(ctx, id, fixed, sliding)
			return used(res...), err
		}, want: []int64{2, 2}, fixed: 2, sliding: 2},
		{name: "Refund", before: 2, call: func(t *testing.T, id string) ([]int64, error) {
			r, err := l.Refund(ctx, fixed, id, 1)
			return used(r), err
		}, want: []int64{1}, fixed: 1, sliding: 2},
		{name: "Refund sliding", before: 2, call: func(t *testing.T, id string) ([]int64, error) {
			r, err := l.Refund(ctx, sliding, id, 1)
			return used(r), err
		}, want: []int64{1}, fixed: 2, sliding: 1},
		{name: "denied Allow", before: 5, call: func(t *testing.T, id string) ([]int64, error) {
			r, err := l.Allow(ctx, fixed, id)
			return used(r), err
		}, want: []int64{5}, fixed: 5, sliding: 5},
		{name: "Reset", before: 2, between: true, call: func(t *testing.T, id string) ([]int64, error) {
			return nil, l.Reset(ctx, fixed, id)
		}, want: nil, fixed: 1, sliding: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Replies are remembered per id: one id per case, apart from other tests.
			id := string(storetest.UseType(t, "id"))
			for range tc.before {
				if _, err := other.AllowAll(ctx, id, fixed, sliding); err != nil {
					t.Fatal(err)
				}
			}
			var between func()
			if tc.between {
				between = func() {
					if _, err := other.Allow(ctx, fixed, id); err != nil {
						t.Errorf("Allow between the lost reply and the retry: %v", err)
					}
				}
			}
			drops := proxy.drops()
			proxy.arm("evalsha", between)
			got, err := tc.call(t, id)
			if err != nil {
				t.Fatal(err)
			}
			if n := proxy.drops() - drops; n != 1 {
				t.Fatalf("the proxy lost %d replies, want 1", n)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("Used = %v after a lost reply, want %v", got, tc.want)
			}
			c, err := direct.HGet(ctx, redisstore.Key(fixed.UseType, id), "c").Int64()
			if errors.Is(err, redis.Nil) {
				c, err = 0, nil
			}
			if err != nil || c != tc.fixed {
				t.Errorf("stored count = %d (%v), want %d", c, err, tc.fixed)
			}
			z, err := direct.ZCard(ctx, redisstore.LogKey(sliding.UseType, id)).Result()
			if err != nil || z != tc.sliding {
				t.Errorf("sliding log holds %d events (%v), want %d", z, err, tc.sliding)
			}
			// A Reset, which deletes the hashes, keeps its reply under a
			// short-lived key in the id's slot; every other write keeps
			// its record in the hashes it wrote, and no key of its own.
			memos := 0
			for it := direct.Scan(ctx, 0, "countlimit:{"+id+"}:*", 1000).Iterator(); it.Next(ctx); {
				memos++
				ttl, err := direct.PTTL(ctx, it.Val()).Result()
				if err != nil {
					t.Fatal(err)
				}
				if ttl <= 0 || ttl > redisstore.ReplyTTL {
					t.Errorf("%s: TTL %v, want in (0, %v]", it.Val(), ttl, redisstore.ReplyTTL)
				}
			}
			if reset := tc.name == "Reset"; reset && memos == 0 {
				t.Errorf("no remembered reply under countlimit:{%s}:*", id)
			} else if !reset && memos > 0 {
				t.Errorf("%d keys under countlimit:{%s}:*, want none: a write keeps no key of its own", memos, id)
			}
		})
	}
}

// deadlineHook records the deadline of the contexts commands run with, and
// when each was sent.
type deadlineHook struct {
	mu        sync.Mutex
	deadlines []time.Time // zero for none
	sent      []time.Time
}

func (h *deadlineHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *deadlineHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		d, _ := ctx.Deadline()
		h.mu.Lock()
		h.deadlines, h.sent = append(h.deadlines, d), append(h.sent, time.Now())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (h *deadlineHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// deadlineLimiter returns a Limiter on a Store on a new client, and the
// hook that records the deadlines of the client's commands.
func deadlineLimiter(t *testing.T) (*deadlineHook, *countlimit.Limiter) {
	c := client(t)
	h := &deadlineHook{}
	c.AddHook(h)
	return h, countlimit.New(redisstore.New(c, guarded()...))
}

// TestCallsEndBeforeTheirRepliesExpire: go-redis repeats a call only while
// its context lives, so every call must end well before its reply expires,
// even on a context without a deadline.
func TestCallsEndBeforeTheirRepliesExpire(t *testing.T) {
	t.Parallel()
	h, l := deadlineLimiter(t)
	rule := countlimit.Rule{UseType: storetest.UseType(t, "bounded"), Limit: 1, Window: countlimit.Fixed(time.Minute)}
	start := time.Now()
	if _, err := l.Allow(context.Background(), rule, "id"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	short, _ := ctx.Deadline()
	if err := l.Reset(ctx, rule, "id"); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.deadlines) < 2 {
		t.Fatalf("%d commands seen, want 2 or more", len(h.deadlines))
	}
	// The margin covers a reconnect's handshake, which the deadline may not cut short.
	const margin = 5 * time.Second
	switch d := h.deadlines[0]; {
	case d.IsZero():
		t.Errorf("Allow without a deadline ran without one, want one at most %v after its start", redisstore.ReplyTTL-margin)
	case d.Sub(start) > redisstore.ReplyTTL-margin:
		t.Errorf("Allow without a deadline ran with deadline %v after its start, want at most %v", d.Sub(start), redisstore.ReplyTTL-margin)
	}
	if d := h.deadlines[len(h.deadlines)-1]; !d.Equal(short) {
		t.Errorf("Reset with a 1s deadline ran with deadline %v, want the caller's %v", d, short)
	}
}
