"""The family's validation of client sampling values: what passes it, the engine can hold."""

from __future__ import annotations

import pytest
import torch

from duplex_actors.model.errors import InvalidRuntimeConfig
from duplex_actors.model.family import MAX_TOP_K, ModelFamily, validate_sampling
from duplex_actors.model.sampling import SlotSampler

DEFAULT = ModelFamily.default_sampling


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"top_k": 2**63}, "top_k must be < 2**31"),
        ({"top_k_text": MAX_TOP_K}, "top_k_text must be < 2**31"),
        ({"top_k": 10**400}, "top_k must be < 2**31"),  # JSON integers have no bound
        ({"seed": 10**400}, "seed must be < 2**32"),
        ({"temperature": 10**400}, "temperature must be <= 5"),
        ({"temperature": float("inf")}, "finite"),
        ({"top_k": float("nan")}, "finite"),
        ({"top_k": 2.5}, "integer"),
        ({"top_k": -1}, ">= 0"),
        ({"seed": True}, "number"),
    ],
)
def test_out_of_range_values_are_refused_with_the_config_error(values, message):
    with pytest.raises(InvalidRuntimeConfig, match=message.replace("*", r"\*")):
        validate_sampling(values, DEFAULT)


def test_every_accepted_value_fits_the_slot_sampler():
    config = validate_sampling(
        {"top_k": MAX_TOP_K - 1, "top_k_text": 3.0, "seed": 2**32 - 1, "temperature": 5}, DEFAULT
    )
    assert (config.top_k, config.top_k_text, config.seed) == (MAX_TOP_K - 1, 3, 2**32 - 1)
    sampler = SlotSampler(1, "cpu")
    sampler.configure(0, config)
    with sampler.active():
        tokens = sampler.sample(torch.randn(1, 1, 1, 16))
    assert tokens.shape == (1, 1, 1)
