package redisstore

// WithMaxScript bounds a combined fast.lua script to at most calls calls
// and, past its first call, about bytes of keys and arguments (the
// defaults are 64 calls and 16 KiB), for the tests that make a pipeline
// split into several scripts. Values below 1 keep the default.
func WithMaxScript(calls, bytes int) Option {
	return func(c *config) {
		if calls > 0 {
			c.scriptCalls = calls
		}
		if bytes > 0 {
			c.scriptBytes = bytes
		}
	}
}
