"""What every Neuron stack shares: the package probes (packages.py), the recipe helpers (common.py) and the declared
SDK / vLLM pairings (support_matrix.py)."""
