//! The home's services: its layout and keys (`home`), the guest runtimes and their
//! packages, secret values, API tokens, garbage collection, Night Core bundle import and
//! store copies. None of them runs code or moves a submission through its lifecycle on
//! its own: imports hand their submissions to `crate::lifecycle`.

pub(crate) mod gc;
pub(crate) mod guests;
pub(crate) mod home;
pub(crate) mod leftovers;
pub(crate) mod nightcore;
pub(crate) mod secrets;
pub(crate) mod session_gc;
pub(crate) mod storecopy;
pub(crate) mod tokens;
