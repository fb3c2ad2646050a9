"""Serving nxd / tnx artifacts with vLLM: the launch spec (launch.py), one module per target (v0.py: vLLM 0.9 V0
and the AWS fork; plugin.py: the classic vllm-neuron plugin), the target choice (targets.py) and what each target
can do for structured outputs (structured.py)."""
