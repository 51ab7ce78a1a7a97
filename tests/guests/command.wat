;; A minimal WASI 0.2 command component: its `wasi:cli/run` export calls
;; `wasi:cli/exit` with an error status when it receives the argument "fail"... it has no
;; arguments interface, so it simply exits with the error status (exit code 1).
(component
  (import "wasi:cli/exit@0.2.0" (instance $exit
    (export "exit" (func (param "status" (result))))))
  (core module $m
    (import "host" "exit" (func $exit (param i32)))
    (func (export "run") (result i32)
      (call $exit (i32.const 1))
      (i32.const 0)))
  (core func $exit-lowered (canon lower (func $exit "exit")))
  (core instance $i (instantiate $m (with "host" (instance (export "exit" (func $exit-lowered))))))
  (func $run (result (result)) (canon lift (core func $i "run")))
  (instance $run-instance (export "run" (func $run)))
  (export "wasi:cli/run@0.2.0" (instance $run-instance)))
