package redisstore

// ReplyTTL is how long a write's reply is kept, for the tests.
const ReplyTTL = replyTTL
