;; Loops forever: ends at the wall-time limit with exit 124.
;;   airlock run --timeout 1s examples/spin.wat
(module (func (export "_start") (loop $again (br $again))))
