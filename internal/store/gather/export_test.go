package gather

// SetHooks sets b's test hooks: afterLeaveFn runs when a caller whose
// context ended did not find its call in the queue (before it tries to
// abandon the call), afterRequeueFn when a batch has put at least one call
// back in the queue to be sent again. Call it before b's first Do.
func SetHooks(b *Batcher, afterLeaveFn, afterRequeueFn func()) {
	b.afterLeave, b.afterRequeue = afterLeaveFn, afterRequeueFn
}
