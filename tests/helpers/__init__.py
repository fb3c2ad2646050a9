"""Helpers shared by tests of several packages (and by bench/): tiny models and tokenizers, PEFT adapters, manifests,
a moto S3 server, a fresh interpreter, the third-party eval clients. Helpers of one package's tests stay beside them
(tests/runtime/serving.py, tests/pipeline/builds.py, tests/convert/eagle_fixtures.py, ...)."""
