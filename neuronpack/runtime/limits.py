"""Default limits of `neuronpack serve` (docs/serve.md, "Limits"), importable without the web stack or torch.

Example: ``EngineLimits(max_waiting=DEFAULT_MAX_WAITING, request_timeout=DEFAULT_REQUEST_TIMEOUT)``.
"""

DEFAULT_MAX_BODY_BYTES = 2 * 1024 * 1024  # a larger request body gets 413
DEFAULT_MAX_WAITING = 128  # requests that may wait for a batch slot; one more gets 503
DEFAULT_REQUEST_TIMEOUT = 600.0  # seconds from arrival (queue + generation); 0 disables it
DEFAULT_SHUTDOWN_GRACE = 25.0  # seconds on SIGTERM; under Kubernetes' default 30 s terminationGracePeriodSeconds
DEFAULT_PREFIX_CACHE_MIB = 512.0  # the block pool beyond the batch that keeps cached prefixes (engine/prefix_cache.py)
DEFAULT_REQUEST_LOG_MIB = 64.0  # --request-log rotates at this size (about 400,000 lines without prompts)
DEFAULT_REQUEST_LOG_BACKUPS = 3  # rotated request logs kept (FILE.1 .. FILE.3)
RETRY_AFTER_SECONDS = 1  # what a 503 (queue full, shutting down) tells clients to wait
