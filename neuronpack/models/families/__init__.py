"""One module per model family, each its differences from the Llama family (families/llama.py), found by
models/registry.py from a checkpoint's model_type. Importing a family is torch-free; its modules import torch."""
