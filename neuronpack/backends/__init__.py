"""Compile backends: nxd (NxD Inference), tnx (transformers-neuronx) and torch (portable torch.export + AOTInductor).

Framework detection and the backend registry live in ``select.py``; each framework has its own module.
"""
