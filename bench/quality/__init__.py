"""Quality benches: how much of the formulas the tests pin (mutation testing of the memory
model and the cost model)."""
