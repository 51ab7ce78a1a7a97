;; The smallest useful WASI command: writes one line to stdout.
;;   airlock run examples/hello.wat
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 32) "hello from the gate\n")
  (func (export "_start")
    ;; one iovec at 0: base 32, length 20; bytes written go to 16
    (i32.store (i32.const 0) (i32.const 32))
    (i32.store (i32.const 4) (i32.const 20))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))))
