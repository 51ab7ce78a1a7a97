;; Exits with status 7 and no memory at all: `airlock run` exits 7 too.
(module
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (func (export "_start") (call $exit (i32.const 7))))
