"""TEST STAND-IN for neuronx-distributed-inference 0.9 (the Neuron SDK cannot run here).

Same module paths and class names as the real package; it records what neuronpack calls (``_standin.CALLS``) and
writes the files the real ``compile()`` writes. It compiles nothing.
"""

__version__ = "0.9.17334"
