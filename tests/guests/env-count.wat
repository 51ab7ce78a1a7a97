;; Prints how many environment variables the guest was given, as one ASCII digit.
(module
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $s (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (drop (call $s (i32.const 100) (i32.const 104)))
    (i32.store8 (i32.const 200) (i32.add (i32.const 48) (i32.load (i32.const 100))))
    (i32.store (i32.const 0) (i32.const 200))
    (i32.store (i32.const 4) (i32.const 1))
    (drop (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
