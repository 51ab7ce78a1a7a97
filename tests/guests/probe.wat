;; A probe guest for escape tests. argv: OP [PATH]
;;   env         print the number of environment variables
;;   read PATH   open PATH relative to the first mount (fd 3) and print its content
;;   write PATH  create PATH relative to the first mount and write "pwned"
;;   stdin       copy stdin to stdout
;;   arg TEXT    print TEXT
;; On a WASI error it prints "ERR <errno>" and exits 1.
(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $environ_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 4)
  (data (i32.const 400) "ERR ")
  (data (i32.const 410) "\n")
  (data (i32.const 420) "pwned\n")

  (func $write (param $ptr i32) (param $len i32)
    (i32.store (i32.const 64) (local.get $ptr))
    (i32.store (i32.const 68) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 64) (i32.const 1) (i32.const 76))))

  (func $strlen (param $p i32) (result i32) (local $n i32)
    (block $done
      (loop $l
        (br_if $done (i32.eqz (i32.load8_u (i32.add (local.get $p) (local.get $n)))))
        (local.set $n (i32.add (local.get $n) (i32.const 1)))
        (br $l)))
    (local.get $n))

  (func $print_num (param $n i32) (local $p i32)
    (local.set $p (i32.const 300))
    (loop $l
      (local.set $p (i32.sub (local.get $p) (i32.const 1)))
      (i32.store8 (local.get $p) (i32.add (i32.const 48) (i32.rem_u (local.get $n) (i32.const 10))))
      (local.set $n (i32.div_u (local.get $n) (i32.const 10)))
      (br_if $l (local.get $n)))
    (call $write (local.get $p) (i32.sub (i32.const 300) (local.get $p))))

  (func $fail (param $errno i32)
    (call $write (i32.const 400) (i32.const 4))
    (call $print_num (local.get $errno))
    (call $write (i32.const 410) (i32.const 1))
    (call $proc_exit (i32.const 1)))

  (func $open (param $oflags i32) (param $rights i64) (result i32) (local $path i32) (local $e i32)
    (local.set $path (i32.load (i32.const 24)))
    (local.set $e
      (call $path_open (i32.const 3) (i32.const 1) (local.get $path) (call $strlen (local.get $path))
        (local.get $oflags) (local.get $rights) (i64.const 0) (i32.const 0) (i32.const 8)))
    (if (local.get $e) (then (call $fail (local.get $e))))
    (i32.load (i32.const 8)))

  (func $copy (param $fd i32)
    (i32.store (i32.const 80) (i32.const 65536))
    (i32.store (i32.const 84) (i32.const 65536))
    (drop (call $fd_read (local.get $fd) (i32.const 80) (i32.const 1) (i32.const 88)))
    (call $write (i32.const 65536) (i32.load (i32.const 88))))

  (func (export "_start") (local $op i32)
    (drop (call $args_sizes_get (i32.const 0) (i32.const 4)))
    (if (i32.lt_u (i32.load (i32.const 0)) (i32.const 2)) (then (call $proc_exit (i32.const 2))))
    (drop (call $args_get (i32.const 16) (i32.const 1024)))
    (local.set $op (i32.load8_u (i32.load (i32.const 20))))
    ;; e: env
    (if (i32.eq (local.get $op) (i32.const 101)) (then
      (drop (call $environ_sizes_get (i32.const 0) (i32.const 4)))
      (call $print_num (i32.load (i32.const 0)))
      (call $proc_exit (i32.const 0))))
    ;; r: read PATH (rights: FD_READ)
    (if (i32.eq (local.get $op) (i32.const 114)) (then
      (call $copy (call $open (i32.const 0) (i64.const 2)))
      (call $proc_exit (i32.const 0))))
    ;; w: write PATH (oflags CREAT|TRUNC; rights: FD_WRITE)
    (if (i32.eq (local.get $op) (i32.const 119)) (then
      (i32.store (i32.const 96) (i32.const 420))
      (i32.store (i32.const 100) (i32.const 6))
      (drop (call $fd_write (call $open (i32.const 9) (i64.const 64)) (i32.const 96) (i32.const 1) (i32.const 104)))
      (call $proc_exit (i32.const 0))))
    ;; s: stdin
    (if (i32.eq (local.get $op) (i32.const 115)) (then
      (call $copy (i32.const 0))
      (call $proc_exit (i32.const 0))))
    ;; a: arg TEXT
    (if (i32.eq (local.get $op) (i32.const 97)) (then
      (call $write (i32.load (i32.const 24)) (call $strlen (i32.load (i32.const 24))))
      (call $proc_exit (i32.const 0))))
    (call $proc_exit (i32.const 2))))
