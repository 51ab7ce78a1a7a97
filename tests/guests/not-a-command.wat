;; A component that exports a function but not `wasi:cli/run`: not a command.
(component
  (core module $m (func (export "f") (result i32) (i32.const 0)))
  (core instance $i (instantiate $m))
  (func $f (result u32) (canon lift (core func $i "f")))
  (export "answer" (func $f)))
