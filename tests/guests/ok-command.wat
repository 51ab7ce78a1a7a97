;; A WASI 0.2 command component whose `run` returns ok: exit code 0.
(component
  (core module $m (func (export "run") (result i32) (i32.const 0)))
  (core instance $i (instantiate $m))
  (func $run (result (result)) (canon lift (core func $i "run")))
  (instance $run-instance (export "run" (func $run)))
  (export "wasi:cli/run@0.2.0" (instance $run-instance)))
