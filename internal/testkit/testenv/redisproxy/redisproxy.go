// Package redisproxy is a test proxy in front of a Redis server that may
// answer some commands itself: a test sees a server whose CONFIG says what
// the test needs (an evicting maxmemory-policy, a refused CONFIG) without
// changing the settings of a server other tests share.
//
// The proxy handles one command at a time per connection, in order: it
// reads a command, answers it or passes it on and relays the one reply, so
// pipelines work, only without their speed. It speaks RESP2 and RESP3 and
// passes on everything it does not answer, HELLO, AUTH and SELECT included.
package redisproxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/countlimit/countlimit/internal/store/redisurl"
)

// Answer returns the reply to cmd (its name and arguments, as sent) when the
// proxy answers it itself, in RESP; ok false passes cmd on to the server.
type Answer func(cmd []string) (reply string, ok bool)

// Proxy is a running proxy. It is safe for concurrent use.
type Proxy struct {
	url      string
	upstream func() (net.Conn, error)
	answer   Answer
	ln       net.Listener

	mu     sync.Mutex
	counts map[string]int
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

// Start starts a proxy on a loopback port in front of the server at
// serverURL (redis:// or rediss://), answering with answer (nil passes
// everything on), and stops it when t ends.
func Start(t testing.TB, serverURL string, answer Answer) *Proxy {
	t.Helper()
	opts, err := redisurl.Options(serverURL)
	if err != nil {
		t.Fatalf("redisproxy: %v", err)
	}
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
		t.Fatalf("redisproxy: want a redis:// or rediss:// URL, got %q (%v)", u.Redacted(), err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redisproxy: %v", err)
	}
	p := &Proxy{
		answer: answer,
		ln:     ln,
		counts: map[string]int{},
		conns:  map[net.Conn]bool{},
		upstream: func() (net.Conn, error) {
			if opts.TLSConfig != nil {
				return tls.Dial(opts.Network, opts.Addr, opts.TLSConfig)
			}
			return net.Dial(opts.Network, opts.Addr)
		},
	}
	u.Scheme, u.Host = "redis", ln.Addr().String()
	p.url = u.String()
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

// URL returns serverURL with the proxy's address in place of the server's:
// its credentials, database and parameters are the server's.
func (p *Proxy) URL() string { return p.url }

// Addr returns the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Count reports how many commands the proxy has read whose name and first
// argument, lower-cased and joined by a space, are name ("config get"), or
// whose name is name ("ping").
func (p *Proxy) Count(name string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[name]
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

// track adds c to the connections Close closes, or closes it when the
// proxy is closed already.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) serve(client net.Conn) {
	defer client.Close()
	if !p.track(client) {
		return
	}
	var server net.Conn
	defer func() {
		if server != nil {
			server.Close()
		}
	}()
	var fromServer *bufio.Reader
	in, out := bufio.NewReader(client), bufio.NewWriter(client)
	for {
		raw, cmd, err := readCommand(in)
		if err != nil {
			return
		}
		p.count(cmd)
		if p.answer != nil {
			if reply, ok := p.answer(cmd); ok {
				if _, err := out.WriteString(reply); err != nil {
					return
				}
				if in.Buffered() == 0 && out.Flush() != nil {
					return
				}
				continue
			}
		}
		if server == nil {
			if server, err = p.upstream(); err != nil {
				out.WriteString("-ERR redisproxy: " + strings.ReplaceAll(err.Error(), "\r\n", " ") + "\r\n")
				out.Flush()
				return
			}
			if !p.track(server) {
				return
			}
			fromServer = bufio.NewReader(server)
		}
		if _, err := server.Write(raw); err != nil {
			return
		}
		if err := copyReply(out, fromServer); err != nil {
			return
		}
		if in.Buffered() == 0 && out.Flush() != nil {
			return
		}
	}
}

func (p *Proxy) count(cmd []string) {
	if len(cmd) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	name := strings.ToLower(cmd[0])
	p.counts[name]++
	if len(cmd) > 1 {
		p.counts[name+" "+strings.ToLower(cmd[1])]++
	}
}

// readCommand reads one command as clients send it, an array of bulk
// strings, and returns its bytes and its parts.
func readCommand(r *bufio.Reader) (raw []byte, cmd []string, err error) {
	line, err := readLine(r)
	if err != nil {
		return nil, nil, err
	}
	if line[0] != '*' {
		return nil, nil, fmt.Errorf("redisproxy: want an array, got %q", line)
	}
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil || n < 0 {
		return nil, nil, fmt.Errorf("redisproxy: bad array header %q", line)
	}
	raw = append(raw, line...)
	for range n {
		line, err := readLine(r)
		if err != nil {
			return nil, nil, err
		}
		size, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if line[0] != '$' || err != nil || size < 0 {
			return nil, nil, fmt.Errorf("redisproxy: want a bulk string, got %q", line)
		}
		raw = append(raw, line...)
		body := make([]byte, size+2)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, nil, err
		}
		raw = append(raw, body...)
		cmd = append(cmd, string(body[:size]))
	}
	return raw, cmd, nil
}

// copyReply copies one reply, RESP2 or RESP3, from r to w.
func copyReply(w *bufio.Writer, r *bufio.Reader) error {
	line, err := readLine(r)
	if err != nil {
		return err
	}
	if _, err := w.Write(line); err != nil {
		return err
	}
	n := 0
	switch line[0] {
	case '+', '-', ':', '_', ',', '#', '(':
		return nil
	case '$', '!', '=', '*', '~', '>', '%', '|':
		if n, err = strconv.Atoi(string(line[1 : len(line)-2])); err != nil {
			return fmt.Errorf("redisproxy: bad reply header %q", line)
		}
	default:
		return fmt.Errorf("redisproxy: unknown reply type %q", line)
	}
	if n < 0 {
		return nil // a null
	}
	switch line[0] {
	case '$', '!', '=':
		_, err := io.CopyN(w, r, int64(n)+2)
		return err
	case '%', '|':
		n *= 2
	}
	if line[0] == '|' {
		n++ // an attribute comes before the reply it describes
	}
	for range n {
		if err := copyReply(w, r); err != nil {
			return err
		}
	}
	return nil
}

// readLine reads up to and including "\r\n".
func readLine(r *bufio.Reader) ([]byte, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, errors.New("redisproxy: bad line")
	}
	return line, nil
}

// ConfigGet answers CONFIG GET of the parameters in values with them, as
// RESP2's array of names and values (which go-redis reads on RESP3 too),
// and passes on every other command. A parameter it does not know gets no
// entry, as from Redis.
func ConfigGet(values map[string]string) Answer {
	return func(cmd []string) (string, bool) {
		if len(cmd) < 2 || !strings.EqualFold(cmd[0], "config") || !strings.EqualFold(cmd[1], "get") {
			return "", false
		}
		var parts []string
		for _, name := range cmd[2:] {
			if v, ok := values[strings.ToLower(name)]; ok {
				parts = append(parts, name, v)
			}
		}
		var b strings.Builder
		fmt.Fprintf(&b, "*%d\r\n", len(parts))
		for _, s := range parts {
			fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(s), s)
		}
		return b.String(), true
	}
}

// RefuseConfig answers every CONFIG command with the error msg (as a
// managed service that hides CONFIG does: "ERR unknown command 'CONFIG'"),
// and passes on every other command.
func RefuseConfig(msg string) Answer {
	return func(cmd []string) (string, bool) {
		if len(cmd) == 0 || !strings.EqualFold(cmd[0], "config") {
			return "", false
		}
		return "-" + msg + "\r\n", true
	}
}
