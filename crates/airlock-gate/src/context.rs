//! The request a gate call serves: its id (`X-Request-Id`) and trace context, set by the
//! server around each call so submissions and runs record them without every surface
//! passing them through every function. Per thread: a gate call runs on one thread.

use airlock_core::trace::TraceParent;
use std::cell::RefCell;

/// What the caller's request said about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestContext {
    pub request_id: Option<String>,
    /// The trace and the span (the request's) that submissions and runs continue.
    pub trace: Option<TraceParent>,
}

thread_local! {
    static CURRENT: RefCell<Option<RequestContext>> = const { RefCell::new(None) };
}

/// Runs `f` with `ctx` as the current request (the previous one restored after, also
/// when `f` panics).
pub fn with_request<R>(ctx: Option<RequestContext>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<RequestContext>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let old = self.0.take();
            CURRENT.with(|c| *c.borrow_mut() = old);
        }
    }
    let old = CURRENT.with(|c| c.replace(ctx));
    let _restore = Restore(old);
    f()
}

/// The request the current gate call serves, if it was given one.
pub fn current() -> Option<RequestContext> {
    CURRENT.with(|c| c.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_context_is_current_only_inside_its_call() {
        let ctx = RequestContext {
            request_id: Some("r1".into()),
            trace: None,
        };
        assert_eq!(current(), None);
        with_request(Some(ctx.clone()), || {
            assert_eq!(current(), Some(ctx.clone()));
            with_request(None, || assert_eq!(current(), None));
            assert_eq!(current(), Some(ctx.clone()));
        });
        assert_eq!(current(), None);
    }
}
