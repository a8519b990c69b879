// Package redisurl opens go-redis clients from URLs (redis://, rediss://,
// unix://): the one way the countlimit command, the project's tests and
// redisstoretest do it.
package redisurl

import (
	"net/url"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Options returns the client options rawURL names, with
// ContextTimeoutEnabled set: without it go-redis ignores a context's
// deadline, and a server that does not answer holds a call until the
// client's ReadTimeout (see redisstore's package doc).
func Options(rawURL string) (*redis.Options, error) {
	o, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	o.ContextTimeoutEnabled = true
	return o, nil
}

// Open returns a client on rawURL's server with Options' settings, changed
// by each of tune in turn.
func Open(rawURL string, tune ...func(*redis.Options)) (*redis.Client, error) {
	o, err := Options(rawURL)
	if err != nil {
		return nil, err
	}
	for _, f := range tune {
		f(o)
	}
	return redis.NewClient(o), nil
}

// OnDB returns a client with o's settings on logical database db; o is
// left as it was.
func OnDB(o *redis.Options, db int) *redis.Client {
	c := *o
	c.DB = db
	return redis.NewClient(&c)
}

// WithDB returns rawURL naming logical database db instead of its own: in
// the path of a redis:// or rediss:// URL, in the db parameter of a
// unix:// one.
func WithDB(rawURL string, db int) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	if u.Scheme == "unix" {
		q := u.Query()
		q.Set("db", strconv.Itoa(db))
		u.RawQuery = q.Encode()
	} else {
		u.Path = "/" + strconv.Itoa(db)
	}
	return u.String(), nil
}
