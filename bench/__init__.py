"""neuronpack's benchmarks: one module per measurement, run from the repository root as ``python -m bench.<name>``
(``make bench-<name>``, ``make bench`` / ``make bench-all``). Their shared skeleton is ``bench/_common.py``; results
go to docs/bench/<name>.json (+ .png)."""
