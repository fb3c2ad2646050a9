"""TEST STAND-IN for vllm_neuron/utils/hardware_config.py (missing from ../shared/upstream): compile/platform.py's
``get_server_prefix`` imports ``parse_range_list`` and applies it to NEURON_VISIBLE_DEVICES ("0-7", "0,2,4")."""

from __future__ import annotations


def parse_range_list(text: str) -> list[int]:
    values: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        low, _, high = part.partition("-")
        values += range(int(low), int(high or low) + 1)
    return values
