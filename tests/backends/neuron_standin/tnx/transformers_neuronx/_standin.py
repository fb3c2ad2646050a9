"""The call record of the stand-in SDK: (event, payload) tuples, in call order."""

CALLS: list[tuple[str, dict]] = []


def record(event: str, **payload) -> None:
    CALLS.append((event, payload))


def events(name: str) -> list[dict]:
    return [payload for event, payload in CALLS if event == name]
