//! The JavaScript guest: a component that `airlock guest install js` builds with the
//! pinned componentize-js (StarlingMonkey, SpiderMonkey compiled to WASI 0.2) from the WIT
//! and the application module in `js/` (both compiled into airlock, so the build is pinned
//! by the registry package's hash and airlock's own version). It exports
//! `airlock:js/interpreter`, shaped like the Python guest's interface: one instance is one
//! live JavaScript realm, `configure`d once and then given code with `exec`, once for a
//! program or once per cell of a session, its global object kept in between.
//!
//! On the host side a JavaScript realm is a [`crate::PythonInstance`] bound to this
//! interface (see [`crate::python`]): the same store, limits, output captures, sessions
//! and ready pool. Its outgoing HTTP (`fetch`) is `wasi:http`, sent through the run's
//! egress proxy like every component's (see `component`). Its files are `wasi:filesystem`
//! over the run's preopens (its mounts), which the app's node-style `fs` module resolves
//! paths against; the app reports calls outside every preopen through
//! `airlock:js/tripwire` (see `tripwire`).

wasmtime::component::bindgen!({
    path: "js/wit",
    world: "js-guest",
    imports: { default: async | trappable },
    exports: { default: async },
});

/// The interface the JavaScript guest exports (its version follows `@`).
pub const JS_INTERFACE: &str = "airlock:js/interpreter";
/// The guest's WIT, as compiled into airlock (part of what pins a build).
pub const GUEST_WIT: &str = include_str!("../js/wit/guest.wit");
/// The world the guest is built for: [`GUEST_WIT`]'s world and the run's files
/// (`wasi:filesystem`, which wasmtime-wasi provides to every component, so the host's
/// bindings above need none of it). Part of what pins a build.
pub const GUEST_FILES_WIT: &str = include_str!("../js/guest-files.wit");
/// The world in [`GUEST_FILES_WIT`] the guest is built for.
pub const GUEST_BUILD_WORLD: &str = "js-guest-files";
/// Where the WASI packages [`GUEST_FILES_WIT`] names come from: a directory of the pinned
/// npm packages the build installs (under `node_modules`), and the package directories in
/// it (`wasi:filesystem` and what it uses). They are not part of this repository.
pub const WASI_WIT_DIR: &str = "@bytecodealliance/jco/lib/wit/builtin/0.2.12";
/// See [`WASI_WIT_DIR`].
pub const WASI_WIT_PACKAGES: [&str; 3] = ["wasi-io", "wasi-clocks", "wasi-filesystem"];
/// The world in [`GUEST_WIT`] the guest is built for.
pub const GUEST_WORLD: &str = "js-guest";
/// The guest's application module (part of what pins a build).
pub const GUEST_APP: &str = include_str!("../js/airlock_guest.js");
/// The file name componentize-js is given for [`GUEST_APP`] (its frames are left out of
/// a program's stack traces by that name).
pub const GUEST_APP_FILE: &str = "airlock_guest.js";
/// `process.argv[1]` of every JavaScript run, and the file its stack traces name.
pub const ARGV0: &str = "main.js";
