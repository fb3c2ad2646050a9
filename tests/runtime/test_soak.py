"""The soak (bench/soak.py), short: 64 concurrent streaming clients with random disconnects for ~15 s against a real
`neuronpack serve` process on the tiny artifact. The long run on SmolLM2 is `make soak` (docs/bench/soak.json)."""

from bench import soak

PROMPTS = ["The quick brown fox", "Hello world! How are you today?", "The lazy dog", "Once upon a time"]


def test_64_streaming_clients_with_disconnects_lose_nothing(serve_artifact):
    result = soak.run(serve_artifact, clients=64, duration=15, disconnect=0.3, threads=1, lengths=(8, 24, 60),
                      prompts=PROMPTS, seed=1)
    assert result.failures == [] and result.lost == 0 and result.garbled == 0
    assert result.completed >= 64 and result.disconnected >= 10  # both paths were exercised, many times
    assert result.slots_freed and result.server_exit_code == 0
    # Every disconnect before the finish became a server-side abort (none left holding a slot).
    assert result.aborted_by_server >= 1
    # Memory: no steady growth once warm (generous: the run is short and the allocator noisy).
    assert result.rss_growth_mb < 64, result.samples
