package gather

// SetHooks sets the functions that run when a caller whose context ended
// did not find its call in the queue (before it tries to abandon the call)
// and when a batch has put calls back in the queue to be sent again; nil
// unsets them.
func SetHooks(afterLeaveFn, afterRequeueFn func()) {
	afterLeave, afterRequeue = afterLeaveFn, afterRequeueFn
}
